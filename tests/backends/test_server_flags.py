"""The servers the llama-server engine starts and the commands a report prints come from one function.

Regression: a report of a llama-server run with draft-mtp, draft-eagle3 or
draft-dspark printed a "speculative" command with no --spec-* flags, because
the command lines were built twice and disagreed.
"""

from __future__ import annotations

import shlex

import pytest

from specview.backends.llama_server.process import LlamaServer
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import ConfigError
from specview.core.llama_flags import llama_commands, server_argv, split_server_args


def _argv(text: str) -> list[str]:
    return shlex.split(text.replace("\\\n", " "))


def _config(spec_type: str, **kw) -> dict:
    draft = "/m/draft.gguf" if spec_type in ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark") else None
    cfg = RunConfig(target="/m/target.gguf", draft=draft, spec_type=spec_type, n_max=5, n_min=1, p_min=0.25,
                    prompt_tokens=(1, 2, 3), backend="llama-server",
                    engine=EngineSettings(n_batch=64, n_ubatch=32, threads=2, server_args=kw.pop("server_args", "")),
                    **kw)
    d = cfg.to_dict()
    d.update(n_ctx_used=512, threads_used=2)
    return d


MODELS = {"target": {"path": "/m/target.gguf"}, "draft": {"path": "/m/draft.gguf"}}
PROMPT = {"tokens": [1, 2, 3], "text": None, "raw_tokens": True}


@pytest.mark.parametrize("spec_type", ["draft-mtp", "draft-eagle3", "draft-dspark", "draft-simple"])
def test_a_draft_family_report_prints_its_spec_flags(spec_type):
    cmds = llama_commands(_config(spec_type), MODELS, PROMPT)
    argv = _argv(cmds["server_speculative"])
    assert argv[argv.index("--spec-type") + 1] == spec_type
    for flag, value in (("--spec-draft-n-max", "5"), ("--spec-draft-n-min", "1"), ("--spec-draft-p-min", "0.25")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert ("-md" in argv) == (spec_type != "draft-mtp")  # MTP drafts with the target's own heads
    if "-md" in argv:
        assert argv[argv.index("-md") + 1] == "/m/draft.gguf"
    vanilla = _argv(cmds["server_vanilla"])
    assert "--spec-type" not in vanilla and "-md" not in vanilla


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod", "ngram-map-k", "none"])
def test_model_free_types_get_their_own_flags_only(spec_type):
    argv = _argv(llama_commands(_config(spec_type), MODELS, PROMPT)["server_speculative"])
    assert argv[argv.index("--spec-type") + 1] == spec_type
    assert "-md" not in argv and "--spec-draft-n-max" not in argv
    assert ("--spec-ngram-simple-size-n" in argv) == (spec_type == "ngram-simple")


@pytest.mark.parametrize("spec_type", ["draft-mtp", "draft-eagle3", "ngram-mod", "draft-simple"])
def test_the_server_started_is_the_reports_command(spec_type):
    """What LlamaServer.for_run starts = the report's command, plus only host, port and --cache-ram 0."""
    config = _config(spec_type, server_args="--no-mmap -ngld 7 --spec-ngram-mod-n-match 24")
    cmds = llama_commands(config, MODELS, PROMPT)
    for speculative, key in ((False, "server_vanilla"), (True, "server_speculative")):
        srv = LlamaServer.for_run("/bin/llama-server", config, target="/m/target.gguf",
                                  draft="/m/draft.gguf" if spec_type != "draft-mtp" and spec_type != "ngram-mod" else None,
                                  speculative=speculative, label="x", known_flags=["--cache-ram"])
        started = srv.command()[1:]
        report = _argv(cmds[key])[1:]
        assert report[-2:][0] == "--port"
        assert started[:len(report) - 2] == report[:-2]
        assert started[len(report) - 2:] == ["--cache-ram", "0", "--host", "127.0.0.1", "--port", "0"]
    spec = _argv(cmds["server_speculative"])
    assert "-ngld" in spec and "--spec-ngram-mod-n-match" in spec  # the drafter's own flags: speculative only
    assert "-ngld" not in _argv(cmds["server_vanilla"]) and "--no-mmap" in _argv(cmds["server_vanilla"])


def test_serial_verify_replaces_the_micro_batch_only():
    config = _config("draft-simple")
    a = server_argv(config, target="/m/t.gguf", draft="/m/d.gguf", speculative=True)
    b = server_argv(config, target="/m/t.gguf", draft="/m/d.gguf", speculative=True, ubatch=1)
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and diff == [("32", "1")] and b[b.index("-ub") + 1] == "1"


def test_server_args_split_between_every_server_and_the_speculative_one():
    both, spec = split_server_args('--temp 0 -ngld 99 --spec-ngram-mod-n-match 24 --no-mmap '
                                   '--override-kv "a=int:1" --spec-draft-p-split -0.5')
    assert both == ["--temp", "0", "--no-mmap", "--override-kv", "a=int:1"]
    assert spec == ["-ngld", "99", "--spec-ngram-mod-n-match", "24", "--spec-draft-p-split", "-0.5"]
    for bad in ("--port 8080", "--host=0.0.0.0", "-m x.gguf", "--spec-type draft-mtp", "-md d.gguf", "-np 2"):
        with pytest.raises(ConfigError, match=bad.split()[0].split("=")[0]) as ei:
            split_server_args(bad)
        assert ei.value.setting == "server_args"
    with pytest.raises(ConfigError, match="cannot split"):
        split_server_args('--override-kv "unclosed')


def test_a_report_of_a_draft_mtp_server_trace_shows_the_flags(tmp_path):
    """The whole report, not just the helper: its speculative server command carries --spec-type draft-mtp."""
    from specview.core import report
    from specview.core.arms.compare import compare_arms
    from specview.core.trace import ArmResult, Step, Trace

    def arm(name, toks):
        a = ArmResult(name=name, tokens=list(toks))
        a.steps = [Step(index=i, token=t, piece=f"<{t}>", pos=3 + i, top_ids=[t, 9], top_logits=[-0.1, -0.6], margin=0.5,
                        round=None, from_draft=None, batch_size=None, batch_index=None) for i, t in enumerate(toks)]
        a.text = "".join(s.piece for s in a.steps)
        return a

    v, s = arm("vanilla", [5, 6, 7]), arm("speculative", [5, 6, 8])
    t = Trace(config=_config("draft-mtp"), environment={"engine": "llama-server", "backend": "llama-server"},
              models={"target": {"path": "/m/target.gguf", "file": "target.gguf"}, "draft": None},
              prompt=dict(PROMPT), vanilla=v, speculative=s, comparison=compare_arms(v, s))
    md = report.trace_markdown(t, {})
    assert "--spec-type draft-mtp" in md and "--spec-draft-n-max 5" in md
