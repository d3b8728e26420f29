"""The trace's JSON form, and the Session's caching, on the fake backend."""

import json
import os
from dataclasses import replace

import pytest

from fakes import FakeBackend
from specview.core.config import EngineSettings
from specview.core.engine import ContextOverflow, SpecviewError
from specview.core.registry import get_backend, register_backend
from specview.core.session import RunConfig, Session
from specview.core.trace import TOP_LEVEL_KEYS, Trace, TraceError, write_atomic


@pytest.fixture()
def fake():
    register_backend("fake", FakeBackend)
    yield get_backend("fake")


def cfg(**kw):
    base = dict(backend="fake", target="0", draft="0:3.0", prompt="hello world", max_tokens=40, ignore_eos=True,
                n_max=4)
    base.update(kw)
    return RunConfig(**base)


def test_trace_round_trips_and_keeps_the_public_keys(fake, tmp_path):
    s = Session()
    t = s.run(cfg())
    p = t.save(tmp_path / "run.json")
    raw = json.loads(p.read_text())
    for k in TOP_LEVEL_KEYS:
        assert k in raw
    assert raw["schema"] == "specview.trace/1"
    assert raw["models"]["target"]["path"] == "0" and raw["models"]["draft"]["path"] == "0:3.0"
    assert raw["prompt"]["tokens"] == s.prompt_tokens(cfg(), s.model("fake", "0", s.resolve(cfg()).settings))
    assert all("drafted" in r and "accepted" in r for r in raw["speculative"]["rounds"])
    assert raw["comparison"]["identical"] is True and raw["comparison"]["first_mismatch"] is None
    back = Trace.load(p)
    assert back.vanilla.tokens == t.vanilla.tokens
    assert [(a.token, a.from_draft, a.round, a.batch_size, a.batch_index) for a in back.speculative.steps] == [
        (b.token, b.from_draft, b.round, b.batch_size, b.batch_index) for b in t.speculative.steps
    ]
    assert [(r.drafted, r.accepted, r.draft_tokens) for r in back.speculative.rounds] == [
        (r.drafted, r.accepted, r.draft_tokens) for r in t.speculative.rounds
    ]
    assert back.comparison == t.comparison
    assert back.dumps() == p.read_text()  # loading and saving again changes nothing
    assert oct(os.stat(p).st_mode & 0o777) != oct(0o600)  # readable by whoever the file is shared with


def test_no_draft_model_records_a_null_draft(fake):
    t = Session().run(cfg(spec_type="ngram-simple", draft=None))
    assert t.models["draft"] is None
    assert t.to_json()["models"]["draft"] is None


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json at all", r"not valid JSON \(Expecting value, line 1, column 1\)"),
        ("", r"not valid JSON \(the file is empty"),
        (" \n", r"not valid JSON \(the file is empty"),
        ('{"schema": "specview.trace/1"}}', r"not valid JSON \(more after the end of its JSON, line 1, column 31\)"),
        ("[1, 2]", r"not a specview trace \(its top level is an array, not an object; a trace's schema is"),
        ('"a trace"', "its top level is a string, not an object"),
        ('{"config": {}}', 'not a specview trace \\(it has no "schema" field'),
        ('{"schema": 1}', "its schema is a number, not a string"),
        ('{"schema": "other.tool/3"}', "not a specview trace \\(its schema is 'other.tool/3'; a trace's schema is"),
        ('{"schema": "specview.trace/99"}', "not supported"),
        ('{"schema": "specview.trace/1", "config": {}}', "missing key"),
    ],
)
def test_malformed_or_foreign_files_are_refused_clearly(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=message) as ei:
        Trace.load(p)
    assert str(p) in str(ei.value)


@pytest.mark.parametrize("keep", [1, 0.5, 0.999])
def test_a_trace_cut_short_is_named_so(fake, tmp_path, keep):
    """A trace copied or written only in part (a full disk, a download stopped early) is refused as cut short,
    with how far it goes, not with the decoder's complaint about whatever character it stopped on."""
    text = Session().run(cfg()).dumps()
    n = max(1, int(len(text.rstrip()) * keep) - 1) if keep < 1 else 1
    p = tmp_path / "cut.json"
    p.write_text(text[:n])
    with pytest.raises(TraceError) as ei:
        Trace.load(p)
    said = str(ei.value)
    assert said.startswith(f"{p}: not valid JSON (it stops in the middle, at line {text[:n].count(chr(10)) + 1} "
                           f"after {n:,} bytes: the file was cut short"), said


def test_inconsistent_trace_is_refused(fake, tmp_path):
    d = Session().run(cfg()).to_json()
    d["vanilla"]["tokens"] = d["vanilla"]["tokens"][:-1]
    p = tmp_path / "cut.json"
    p.write_text(json.dumps(d))
    with pytest.raises(TraceError, match="tokens but"):
        Trace.load(p)
    with pytest.raises(TraceError, match="no such file"):
        Trace.load(tmp_path / "missing.json")


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "t.json"
    write_atomic(p, "old")

    with pytest.raises(TypeError):
        write_atomic(p, 12345)  # type: ignore[arg-type]  # fails inside the write
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["t.json"]  # no temp file left behind
    with pytest.raises(SpecviewError, match="does not exist"):
        write_atomic(tmp_path / "nope" / "t.json", "x")


def test_session_loads_each_model_once_and_reruns_only_the_speculative_arm(fake):
    s = Session()
    c = cfg()
    t1 = s.run(c)
    assert s.loads == 2 and s.vanilla_runs == 1 and s.speculative_runs == 1
    t2 = s.run(replace(c, n_max=1))
    t3 = s.run(replace(c, p_min=1.0))
    t4 = s.run(replace(c, spec_type="ngram-simple", draft=None))
    assert s.loads == 2  # nothing reloaded
    assert s.vanilla_runs == 1 and s.speculative_runs == 4  # vanilla reused three times
    assert t1.vanilla.tokens == t2.vanilla.tokens == t3.vanilla.tokens == t4.vanilla.tokens
    assert t3.speculative.n_drafted == 0 and t3.comparison.identical
    s.run(replace(c, max_tokens=20))  # a different arm length is a different vanilla arm
    assert s.vanilla_runs == 2
    assert fake.loaded.count("0") == 1


def test_a_context_only_the_vanilla_arm_fits_is_refused_before_either_arm_runs(fake):
    n_prompt = len(Session().run(cfg()).prompt["tokens"])
    s = Session()
    vanilla_need = n_prompt + 40 + 1  # the prompt, 40 tokens, the last one's pass
    with pytest.raises(ContextOverflow) as err:
        s.run(cfg(engine=EngineSettings(n_ctx=vanilla_need)))
    assert f"needs a context of {vanilla_need + 4}" in str(err.value)  # and a verify pass of n_max = 4 drafts
    assert "plus 4 draft tokens" in str(err.value)
    assert s.vanilla_runs == 0 and s.speculative_runs == 0  # the advice came before any arm spent its time
    t = s.run(cfg(engine=EngineSettings(n_ctx=vanilla_need + 4)))
    assert len(t.vanilla.tokens) == 40 and t.comparison is not None


def test_run_config_validates_its_values(fake):
    with pytest.raises(SpecviewError, match="needs a draft model"):
        RunConfig(draft=None, prompt="x")
    with pytest.raises(SpecviewError, match="p_min"):
        RunConfig(p_min=1.5, prompt="x")
    with pytest.raises(SpecviewError, match="spec_type must be one of"):  # an in-process engine runs no MTP head
        fake.check(cfg(spec_type="draft-mtp"))
    with pytest.raises(SpecviewError, match="no prompt"):
        RunConfig()
    c = RunConfig(prompt="x", prompt_tokens=None)
    assert RunConfig.from_dict(c.to_dict()) == c


def test_prompt_token_ids_are_checked_against_the_vocabulary(fake):
    from specview.commands.common import cli_error
    from specview.core.errors import ConfigError

    with pytest.raises(ConfigError, match="outside the target's vocabulary") as err:
        Session().run(cfg(prompt=None, prompt_tokens=(1, 2, 999)))
    assert err.value.setting == "prompt_tokens"
    # the command line names the flag the ids came from
    assert str(cli_error(err.value)).startswith("--tokens: id 999 is outside the target's vocabulary (0..")


def test_a_run_past_the_target_s_training_context_says_so(fake, monkeypatch):
    """A model's text degrades past the context it was trained on (SmolLM2: 8,192): the run goes on, both arms
    alike, and says so where its progress goes."""
    from fakes import FakeLoaded

    said: list[str] = []
    monkeypatch.setattr(FakeLoaded, "n_ctx_train", property(lambda self: 32), raising=False)
    Session(progress=said.append).run(cfg(max_tokens=40))
    warned = [m for m in said if m.startswith("warning: ")]
    assert len(warned) == 1 and "past the 32 tokens 0 was trained on" in warned[0], said
    said.clear()
    monkeypatch.setattr(FakeLoaded, "n_ctx_train", property(lambda self: 4096), raising=False)
    Session(progress=said.append).run(cfg(max_tokens=40))
    assert not [m for m in said if m.startswith("warning: ")], said
