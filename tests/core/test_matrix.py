"""The reproducer matrix without models: definitions, cells, streaming, interruption and the plain-words summary.

A fake session stands in for the real one: its traces fork by a rule the test
states (quantized targets fork when something is drafted), so the summary can
be checked against what the rule implies, and an interruption can be planted
at an exact cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specview import cli
from specview.core.arms.compare import compare_arms
from specview.core.config import EngineSettings
from specview.core.engine import SpecviewError
from specview.core.matrix import (
    SCHEMA,
    CellParams,
    MatrixError,
    MatrixSpec,
    PromptSpec,
    builtin_prompts,
    expand,
    grid,
    load_matrix,
    load_spec,
    run_matrix,
    spec_from_dict,
    summarize,
)
from specview.core.registry import Runner
from specview.core.trace import ArmResult, Round, Step, Trace


# ---------------------------------------------------------------------------
# a fake session
# ---------------------------------------------------------------------------
def _arm(name: str, tokens: list[int], rounds: list[Round] | None = None) -> ArmResult:
    steps = [Step(index=i, token=t, piece=f" w{t}", pos=5 + i, top_ids=[t, t + 1], top_logits=[1.0, 0.5],
                  margin=0.5) for i, t in enumerate(tokens)]
    return ArmResult(name=name, tokens=tokens, steps=steps, rounds=rounds or [], text="".join(s.piece for s in steps),
                     gen_ms=100.0 if name == "vanilla" else 80.0, stop_reason="max_tokens",
                     drafter=None if name == "vanilla" else "x")


def forks_by_rule(cfg) -> int | None:
    """The rule the fake follows: a quantized target forks whenever tokens are actually drafted."""
    drafts = cfg.spec_type == "ngram-simple" or (cfg.spec_type == "draft-simple" and cfg.p_min < 1.0)
    if "F16" in cfg.target or not drafts:
        return None
    return 3 + cfg.n_max if cfg.spec_type == "draft-simple" else 7


class FakeSession:
    def __init__(self, *, interrupt_at: int | None = None, fail_target: str | None = None):
        self.loads = 0
        self.vanilla_runs = 0
        self.speculative_runs = 0
        self.calls: list = []
        self.interrupt_at = interrupt_at
        self.fail_target = fail_target
        self._vanilla: set = set()
        self._loaded: set = set()

    def close(self):
        pass

    def run(self, cfg, *, cancel=None, on_event=None):
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        self.calls.append(cfg)
        if cfg.target == self.fail_target:
            raise SpecviewError(f"{cfg.target}: cannot load it")
        for m in (cfg.target, cfg.draft):
            if m and m not in self._loaded:
                self._loaded.add(m)
                self.loads += 1
        key = (cfg.target, cfg.prompt, cfg.prompt_tokens, cfg.engine)
        if key not in self._vanilla:
            self._vanilla.add(key)
            self.vanilla_runs += 1
        self.speculative_runs += 1
        n = cfg.max_tokens
        v = list(range(10, 10 + n))
        f = forks_by_rule(cfg)
        s = list(v) if f is None or f >= n else v[:f] + [999] + v[f + 1:]
        rounds = [Round(index=0, drafted=0, accepted=0, draft_ms=0, verify_ms=1, batch_size=4, first_step=0),
                  Round(index=1, drafted=4, accepted=3, draft_ms=1, verify_ms=1, batch_size=5, first_step=1)]
        va, sa = _arm("vanilla", v), _arm("speculative", s, rounds)
        return Trace(config=cfg.to_dict(), environment={"specview": "test"},
                     models={"target": {"file": cfg.target, "quantization": cfg.target.split(":")[-1]},
                             "draft": None},
                     prompt={"text": cfg.prompt, "chat": cfg.chat, "tokens": [1, 2, 3]},
                     vanilla=va, speculative=sa, comparison=compare_arms(va, sa))


def machine_decided(setting: str):
    """What this machine decides for ``setting`` when a run leaves it unset (``no_repack``: True where the crash
    probe crashed, or where $SPECVIEW_REPACK_PROBE plants that), or None where it decides nothing."""
    _, decisions = Runner.resolve_settings(EngineSettings(), backend="llama.cpp")
    return next((d.value for d in decisions if d.setting == setting), None)


def spec(**kw) -> MatrixSpec:
    d = dict(targets=["demo:F16", "demo:Q8_0", "demo:Q4_K_M"], drafters=["demo:Q4_0", "ngram-simple", "none"],
             n_max=[1, 4], p_min=[0.0, 1.0], flash_attn=["auto"],
             prompts=[PromptSpec("essay", "Write an essay."), PromptSpec("raw", tokens=(5, 6, 7))],
             max_tokens=32, diagnose=False)
    d.update(kw)
    return MatrixSpec(**d)


# ---------------------------------------------------------------------------
# definitions
# ---------------------------------------------------------------------------
def test_expand_runs_n_max_and_p_min_only_for_draft_models():
    cells = expand(spec())
    # per target and prompt: Q4_0 x 2 n_max x 2 p_min = 4 cells, ngram-simple 1, none 1
    assert len(cells) == 3 * 2 * 6
    assert len(set(cells)) == len(cells)
    ngram = [c for c in cells if c.drafter == "ngram-simple"]
    assert len(ngram) == 6 and all(c.n_max is None and c.p_min is None for c in ngram)
    # cells sharing a target and prompt are contiguous, so the cached vanilla arm is reused at once
    order = [(c.target, c.prompt) for c in cells]
    assert order == sorted(order, key=lambda k: (spec().targets.index(k[0]), ["essay", "raw"].index(k[1])))


def test_toml_definition_with_relative_files_raw_tokens_and_engine(tmp_path: Path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "t.gguf").write_bytes(b"GGUF")
    (tmp_path / "p.txt").write_text("Explain a hash table.\n", encoding="utf-8")
    f = tmp_path / "m.toml"
    f.write_text(
        'targets = ["models/t.gguf", "demo:Q8_0"]\n'
        'drafters = ["demo:Q4_0", "ngram-simple"]\n'
        "n_max = [1, 4]\np_min = [0, 1]\nflash_attn = [\"on\", \"off\"]\nmax_tokens = 48\n"
        'builtin_prompts = ["code"]\n'
        'prompts = ["Say hi.", {file = "p.txt", name = "hash"}, {name = "raw", tokens = [1, 2, 3]}]\n'
        "[engine]\nn_batch = 64\nkv_type = \"q8_0\"\n",
        encoding="utf-8")
    s = load_spec(f)
    assert s.targets == [str(tmp_path / "models" / "t.gguf"), "demo:Q8_0"]
    assert s.p_min == [0.0, 1.0] and s.n_max == [1, 4] and s.flash_attn == ["on", "off"]
    assert [p.name for p in s.prompts] == ["code", "prompt1", "hash", "raw"]
    assert s.prompts[2].text == "Explain a hash table.\n"
    assert s.prompts[3].tokens == (1, 2, 3) and s.prompts[3].chat is False
    assert s.engine.n_batch == 64 and s.engine.kv_type == "q8_0"
    s.validate()
    cfgs = {c.flash_attn for c in expand(s)}
    assert cfgs == {"on", "off"}


@pytest.mark.parametrize("text, words", [
    ("targets = [", "not valid TOML"),
    ("quantizations = [\"demo:Q8_0\"]", "unknown key(s) quantizations"),
    ("n_max = [\"three\"]", "'n_max' values must be integers"),
    ("[engine]\nflash_attn = \"on\"", "unknown [engine] key(s) flash_attn"),
    ("builtin_prompts = [\"poem\"]", "unknown built-in prompt 'poem'"),
    ("prompts = [{file = \"missing.txt\"}]", "no such file"),
    ("prompts = [{tokens = []}]", "non-empty list of token ids"),
])
def test_bad_definitions_are_refused_clearly(tmp_path: Path, text: str, words: str):
    f = tmp_path / "bad.toml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(MatrixError) as e:
        load_spec(f)
    assert words in str(e.value)


@pytest.mark.parametrize("kw, words", [
    ({"targets": ["/nonexistent/model.gguf"]}, "no such file"),
    ({"p_min": [1.5]}, "between 0 and 1"),
    ({"flash_attn": ["maybe"]}, "flash_attn values"),
    ({"drafters": []}, "axis 'drafters' is empty"),
    ({"targets": ["demo:Q9_9"]}, "unknown demo quantization"),
])
def test_bad_axis_values_are_refused(kw, words):
    with pytest.raises(SpecviewError) as e:
        spec(**kw).validate()
    assert words in str(e.value)


def test_cli_reports_errors_without_traceback(tmp_path: Path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text("colours = [1]\n", encoding="utf-8")
    assert cli.main(["matrix", "--config", str(f), "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) colours" in err and "Traceback" not in err
    assert cli.main(["matrix", "--config", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a usage error, reported by argparse
        cli.main(["matrix", "--targets", "demo:Q8_0", "--flash-attn", "on,sideways", "--dry-run"])
    assert e.value.code == 2
    assert "flash attention is auto, on or off (got 'sideways')" in capsys.readouterr().err


def test_cli_dry_run_lists_the_cells(capsys):
    rc = cli.main(["matrix", "--targets", "demo:F16,demo:Q8_0", "--drafters", "demo:Q4_0", "--drafters", "none",
                   "--n-max", "1,4", "--p-min", "0", "--tokens", "1,2,3", "-p", "Hi", "--flash-attn", "on,off",
                   "--dry-run"])
    assert rc == 0
    out = capsys.readouterr().out
    # 2 targets x 2 prompts x 2 fa x (2 n_max + none)
    assert "24 cells" in out
    # no repack is this machine's decision (where the crash probe crashed): a one-value axis every label names
    nr = " · nr" if machine_decided("no_repack") else ""
    assert f"F16 · Q4_0 n_max=4 p_min=0 · fa=off{nr} · tokens" in out
    labels = [ln for ln in out.splitlines() if " · " in ln]
    assert len(labels) == 24 and all((" · nr · " in ln) is bool(nr) for ln in labels), out


def test_builtin_prompts_are_four_varied_ones():
    ps = builtin_prompts()
    assert [p.name for p in ps] == ["code", "essay", "list", "technical"]
    assert all(p.text and p.chat for p in ps)


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def test_results_stream_to_the_file_after_every_cell(tmp_path: Path):
    out = tmp_path / "m.json"
    seen_on_disk: list[int] = []

    def on_cell(rec):
        seen_on_disk.append(len(json.loads(out.read_text())["cells"]))

    s = spec()
    run = run_matrix(s, FakeSession(), out=out, on_cell=on_cell)
    n = len(expand(s))
    assert seen_on_disk == list(range(1, n + 1))
    doc = load_matrix(out)
    assert doc["schema"] == SCHEMA and doc["status"] == "complete" and len(doc["cells"]) == n
    assert run.counters == {"loads": 4, "vanilla_runs": 6, "speculative_runs": n}
    for c in doc["cells"]:
        p = CellParams.from_json(c["params"])
        cfg_fork = forks_by_rule(__import__("specview.core.matrix", fromlist=["cell_config"]).cell_config(s, p))
        assert c["first_mismatch"] == cfg_fork
        assert c["identical"] is (cfg_fork is None)
        assert c["verdict"] == ("identical" if cfg_fork is None else "diverged")
        assert c["acceptance_rate"] == 0.75 and c["speedup"] == pytest.approx(1.25)


def test_ctrl_c_keeps_the_finished_cells(tmp_path: Path):
    out = tmp_path / "m.json"
    run = run_matrix(spec(), FakeSession(interrupt_at=5), out=out)
    doc = json.loads(out.read_text())
    assert run.status == "interrupted" and doc["status"] == "interrupted"
    assert [c["index"] for c in doc["cells"]] == [0, 1, 2, 3, 4]
    assert doc["n_cells"] == len(expand(spec()))
    assert "5 cells of 36 finished" in doc["summary"][0]


def test_cancel_between_cells(tmp_path: Path):
    out = tmp_path / "m.json"
    fake = FakeSession()
    run = run_matrix(spec(), fake, out=out, cancel=lambda: len(fake.calls) >= 3)
    assert run.status == "interrupted" and len(run.records) == 3


def test_a_failing_cell_is_recorded_and_the_rest_run(tmp_path: Path):
    run = run_matrix(spec(), FakeSession(fail_target="demo:Q8_0"), out=tmp_path / "m.json")
    errs = [r for r in run.records if r["status"] == "error"]
    assert len(errs) == 12 and all("cannot load it" in r["error"] for r in errs)
    assert len(run.records) == 36 and run.status == "complete"
    assert "12 cells failed" in " ".join(summarize(run.to_json()))


# ---------------------------------------------------------------------------
# the summary and the grid
# ---------------------------------------------------------------------------
def _doc(s: MatrixSpec, tmp_path: Path) -> dict:
    run_matrix(s, FakeSession(), out=tmp_path / "m.json")
    return load_matrix(tmp_path / "m.json")


def test_summary_names_what_flips_the_outcome(tmp_path: Path):
    doc = _doc(spec(), tmp_path)
    text = "\n".join(doc["summary"])
    # the matrix takes this machine's no-repack decision as a one-value axis; a setting's label names it where on
    assert doc["spec"]["no_repack"] == [machine_decided("no_repack")]
    nr = " nr=True" if machine_decided("no_repack") else ""
    assert "every F16 cell is identical" in text.replace("Every", "every")
    assert "p_min = 1 is identical everywhere" in text
    assert "the none drafter is identical everywhere" in text.lower()
    # with the controls set aside, the target alone decides: both quantized targets fork
    assert "Setting aside" in text and "all Q8_0 and Q4_K_M cells fork" in text
    assert "Changing only the n_max or prompt never does." in text  # n_max 1 and 4 fork alike here
    assert "flash attention" not in text  # one value: not an axis of this matrix
    # the rule ignores the prompt: every forking setting forks on both prompts, none on only some
    assert f"Forks on every prompt: Q8_0 with Q4_0 n_max=1 p_min=0{nr} (2 of 2);" in text
    assert f"Q4_K_M with ngram-simple{nr} (2 of 2)" in text and "F16 with" not in text
    assert "Forks on some prompts" not in text


def test_summary_does_not_claim_what_the_cells_contradict(tmp_path: Path, monkeypatch):
    # one F16 cell forks too: "every F16 cell is identical" would now be false and must not be said
    orig = forks_by_rule

    def rule(cfg):
        if "F16" in cfg.target and cfg.spec_type == "ngram-simple" and cfg.prompt_tokens:
            return 9
        return orig(cfg)

    monkeypatch.setitem(globals(), "forks_by_rule", rule)
    text = "\n".join(_doc(spec(), tmp_path)["summary"])
    assert "F16 cell is identical" not in text
    assert "p_min = 1 is identical everywhere" in text


def test_summary_when_nothing_forks(tmp_path: Path):
    text = "\n".join(_doc(spec(targets=["demo:F16"]), tmp_path)["summary"])
    assert "Every cell is identical" in text and "fork" not in text.split("\n", 1)[1]


def test_grid_rows_and_columns(tmp_path: Path):
    g = grid(_doc(spec(), tmp_path))
    assert g.row_axes == ["target", "prompt"] and g.col_axes == ["drafter", "n_max", "p_min"]
    assert [g.row_label(r) for r in g.rows][:2] == ["F16 · essay", "F16 · raw"]
    assert [g.col_label(c) for c in g.cols] == ["Q4_0 n_max=1 p_min=0", "Q4_0 n_max=1 p_min=1",
                                                 "Q4_0 n_max=4 p_min=0", "Q4_0 n_max=4 p_min=1",
                                                 "ngram-simple", "none"]
    assert len(g.at) == 36


def test_partial_matrix_grid_keeps_planned_cells(tmp_path: Path):
    run_matrix(spec(), FakeSession(interrupt_at=2), out=tmp_path / "m.json")
    g = grid(load_matrix(tmp_path / "m.json"))
    assert len(g.rows) * len(g.cols) == 36 and len(g.at) == 2


def test_foreign_files_are_refused(tmp_path: Path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"schema": "specview.trace/1"}))
    with pytest.raises(MatrixError, match="not a specview matrix"):
        load_matrix(f)
    f.write_text("{")
    with pytest.raises(MatrixError, match="not valid JSON"):
        load_matrix(f)


def test_spec_from_dict_defaults_to_builtin_prompts():
    s = spec_from_dict({"targets": ["demo:Q8_0"]})
    assert len(s.prompts) == 4


def test_cli_ctrl_c_writes_the_finished_cells_and_exits_130(tmp_path: Path, monkeypatch, capsys):
    import os
    import signal

    import specview.core.inprocess as session_mod  # where the in-process engines' runner is made

    monkeypatch.setenv("SPECVIEW_WORKER", "0")  # the fake Session is this process's

    class Interrupting(FakeSession):
        def run(self, cfg, **kw):
            trace = super().run(cfg, **kw)
            if len(self.calls) == 3:
                os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C during the third cell
            return trace

        def close(self):
            pass

    monkeypatch.setattr(session_mod, "Session", lambda progress=None: Interrupting())
    out = tmp_path / "m.json"
    before = signal.getsignal(signal.SIGINT)
    rc = cli.main(["matrix", "--targets", "demo:F16,demo:Q8_0", "--drafters", "demo:Q4_0,none", "--p-min", "0,1",
                   "-p", "Hi", "-n", "16", "--no-diagnose", "-o", str(out)])
    assert rc == 130
    doc = json.loads(out.read_text())
    assert doc["status"] == "interrupted" and len(doc["cells"]) == 3 and doc["n_cells"] == 6
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and "3 of 6 cells" in captured.out
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored


def test_resume_runs_only_the_missing_cells(tmp_path: Path):
    out = tmp_path / "m.json"
    run_matrix(spec(), FakeSession(interrupt_at=5), out=out)
    first = load_matrix(out)
    fake = FakeSession()
    run_matrix(spec(), fake, out=out, resume=first)
    assert len(fake.calls) == 31  # 36 planned, 5 kept
    doc = load_matrix(out)
    assert doc["status"] == "complete" and [c["index"] for c in doc["cells"]] == list(range(36))
    assert doc["cells"][:5] == first["cells"]
    with pytest.raises(MatrixError, match="cannot resume"):
        run_matrix(spec(max_tokens=64), FakeSession(), out=tmp_path / "other.json", resume=first)


def test_cli_resume(tmp_path: Path, monkeypatch, capsys):
    import specview.core.inprocess as session_mod  # where the in-process engines' runner is made

    monkeypatch.setenv("SPECVIEW_WORKER", "0")  # the fake Session is this process's

    out = tmp_path / "m.json"
    argv = ["matrix", "--targets", "demo:F16,demo:Q8_0", "--drafters", "demo:Q4_0,none", "-p", "Hi", "-n", "16",
            "--no-diagnose", "-o", str(out)]
    monkeypatch.setattr(session_mod, "Session", lambda progress=None: FakeSession(interrupt_at=2))
    assert cli.main(argv) == 130
    assert len(load_matrix(out)["cells"]) == 2
    fakes = []
    monkeypatch.setattr(session_mod, "Session", lambda progress=None: fakes.append(FakeSession()) or fakes[-1])
    assert cli.main(argv + ["--resume"]) == 1
    assert len(fakes[0].calls) == 6 - 2  # per target: Q4_0 at p_min 0 and 1, none; two were done
    doc = load_matrix(out)
    assert doc["status"] == "complete" and [c["index"] for c in doc["cells"]] == list(range(6))
    assert "resuming: 2 of 6 cells already done" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# the engine's own runner
# ---------------------------------------------------------------------------
from specview.core.registry import Backend, Runner, get_backend, register_backend, unregister_backend  # noqa: E402


class RecordingRunner(Runner):
    """A runner that is not a Session: it runs the fake rule and records what it was asked."""

    def __init__(self):
        self.inner = FakeSession()
        self.diagnosed: list = []
        self.closed = False

    @property
    def loads(self):
        return self.inner.loads

    @property
    def vanilla_runs(self):
        return self.inner.vanilla_runs

    @property
    def speculative_runs(self):
        return self.inner.speculative_runs

    def run(self, cfg, *, on_event=None, cancel=None, reuse_vanilla=True):
        return self.inner.run(cfg, cancel=cancel, on_event=on_event)

    def diagnose(self, trace, cfg, *, controls=False, progress=None, cancel=None):
        self.diagnosed.append(cfg)
        d = {"verdict": "near-tie", "gap": 0.01, "thresholds": {"near_tie": 0.05, "far": 2.0},
             "explanation": "planted"}
        trace.diagnosis = d
        return d

    def close(self):
        self.closed = True


class RemoteBackend(Backend):
    """An engine that is not in-process and whose models are plain names (no files to check)."""

    name = "remote-fake"
    model_kind = "name"
    in_process = False

    def __init__(self):
        self.runners: list[RecordingRunner] = []

    def runner(self, *, progress=None):
        self.runners.append(RecordingRunner())
        return self.runners[-1]


@pytest.fixture()
def remote():
    register_backend("remote-fake", RemoteBackend)
    yield get_backend("remote-fake")
    unregister_backend("remote-fake")


def test_a_matrix_runs_through_its_engines_runner(remote, tmp_path: Path):
    """A matrix whose engine is not in-process runs every cell on that engine's runner, never on a Session."""
    s = spec(backend="remote-fake", diagnose=True)
    run = run_matrix(s, out=tmp_path / "m.json")
    assert len(remote.runners) == 1 and remote.runners[0].closed
    r = remote.runners[0]
    assert [c.backend for c in r.inner.calls] == ["remote-fake"] * len(expand(s))
    forks = [c for c in run.records if not c["identical"]]
    assert forks and len(r.diagnosed) == len(forks)
    assert all(c["verdict"] == "near-tie" and c["gap"] == 0.01 for c in forks)
    assert run.counters["speculative_runs"] == len(expand(s))


def test_cli_matrix_on_a_plugin_engine_and_no_diagnose_never_diagnoses(remote, tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    rc = cli.main(["matrix", "--engine", "remote-fake", "--targets", "demo:F16,demo:Q8_0", "--drafters",
                   "demo:Q4_0,none", "-p", "Hi", "-n", "16", "--no-diagnose", "-o", str(out)])
    assert rc == 1, capsys.readouterr().err
    r = remote.runners[-1]
    assert r.diagnosed == [] and r.closed
    doc = load_matrix(out)
    assert doc["spec"]["backend"] == "remote-fake"
    assert {c["verdict"] for c in doc["cells"] if not c["identical"]} == {"diverged"}


# ---------------------------------------------------------------------------
# keys and flags derived from the settings' declarations
# ---------------------------------------------------------------------------
def _toml(v) -> str:
    return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")


def test_every_declared_setting_is_a_toml_key_checked_as_declared(tmp_path: Path):
    from specview.core.config import EngineSettings, RunConfig, axes
    from specview.core.matrix.spec import cell_settings, matrix_default

    run_keys = cell_settings(RunConfig)
    eng_keys = cell_settings(EngineSettings)
    assert {f.name for f in run_keys} >= {"max_tokens", "n_min", "top_k", "ignore_eos", "serial_verify"}
    assert {f.name for f in eng_keys} >= {"n_batch", "n_ubatch", "kv_type", "threads"}
    assert set(axes()) - {a for a in axes() if a.startswith("vk_")} == {"n_max", "p_min", "flash_attn", "no_repack",
                                                                         "no_op_offload", "rollback"}
    lines, eng = [], []
    for f in run_keys:
        v = matrix_default(f)
        v = f.metadata["min"] if v is None else v
        lines.append(f"{f.name} = {_toml(v)}")
    for f in eng_keys:
        eng.append(f"{f.name} = {_toml(matrix_default(f))}")
    p = tmp_path / "all.toml"
    p.write_text("\n".join(lines + ["[engine]"] + eng) + "\n", encoding="utf-8")
    load_spec(p).validate(check_files=False)
    for f in [*run_keys, *eng_keys]:  # a value below a declared minimum is refused, naming the file and the key
        if f.metadata.get("min") is None:
            continue
        bad = tmp_path / f"bad-{f.name}.toml"
        line = f"{f.name} = {_toml(type(matrix_default(f) or 0)(f.metadata['min'] - 1))}"
        bad.write_text(line + "\n" if f in run_keys else "[engine]\n" + line + "\n", encoding="utf-8")
        with pytest.raises(MatrixError) as e:
            load_spec(bad)
        assert str(bad) in str(e.value) and f.name in str(e.value)


def test_axis_values_are_checked_as_declared_and_errors_name_the_file(tmp_path: Path):
    for text, words in [("p_min = [0.5, 2]", "p_min"), ("n_max = [-1]", "n_max"), ("flash_attn = [\"up\"]", "flash_attn"),
                        ("p_min = [nan]", "p_min"), ("max_tokens = 0", "max_tokens"), ("top_k = 1.5", "top_k"),
                        ("[engine]\nkv_type = \"q9\"", "kv_type"), ("n_max = [[1, [2]]]", "n_max")]:
        f = tmp_path / "m.toml"
        f.write_text(text + "\n", encoding="utf-8")
        with pytest.raises(MatrixError) as e:
            load_spec(f)
        assert str(f) in str(e.value) and words in str(e.value), str(e.value)


def test_a_cell_config_is_the_shared_settings_plus_its_axis_values():
    from specview.core.config import EngineSettings, RunConfig, get_setting
    from specview.core.matrix import cell_config

    s = spec(max_tokens=24, top_k=5, serial_verify=True, stop_after_fork=3, flash_attn=["on", "off"],
             engine=EngineSettings(n_ubatch=1, kv_type="q8_0"))
    for p in expand(s):
        cfg = cell_config(s, p)
        assert isinstance(cfg, RunConfig)
        assert (cfg.max_tokens, cfg.top_k, cfg.serial_verify, cfg.stop_after_fork) == (24, 5, True, 3)
        assert (cfg.engine.n_ubatch, cfg.engine.kv_type, cfg.engine.flash_attn) == (1, "q8_0", p.flash_attn)
        for axis in ("n_max", "p_min"):
            if getattr(p, axis) is not None:
                assert get_setting(cfg, axis) == getattr(p, axis)
        assert cfg.draft == (p.drafter if p.spec_type == "draft-simple" else None)


# ---------------------------------------------------------------------------
# a matrix that cites a kernel map
# ---------------------------------------------------------------------------
from fakes import FakeLoaded, FaultyBackend  # noqa: E402
from specview.core.config import EngineSettings, resolve_threads  # noqa: E402
from specview.core.kernels.map import kernel_map  # noqa: E402
from specview.core.inprocess import InProcessBackend
from specview.core.session import Session  # noqa: E402
from test_kernels import ToyLoaded  # noqa: E402

TOY_PROMPTS = [PromptSpec("p1", tokens=(1, 5, 9, 11)), PromptSpec("p2", tokens=(1, 7, 3, 30, 2, 8))]


class ThreadedToy(ToyLoaded):
    """The kernel-map toy ('dispatch:WIDE:EPS': passes of WIDE rows or more compute other bits), whose contexts
    record a thread count as llama.cpp's do."""

    def new_engine(self, settings, n_ctx):
        eng = super().new_engine(settings, n_ctx)
        eng.threads = resolve_threads(settings.threads)  # 0: $SPECVIEW_THREADS or every core, as llama.cpp's
        return eng


class MatrixToy(InProcessBackend):
    """'dispatch:...' names load the kernel-map toy; 'SEED:NOISE' names a fakes.ToyModel (a drafter that errs)."""

    name = "matrix-toy"
    model_kind = "name"

    def load(self, name, settings):
        return ThreadedToy(name) if name.startswith(("dispatch", "noisy")) else FakeLoaded(name)


class FaultyToy(FaultyBackend):
    model_kind = "name"


@pytest.fixture()
def toy_engine():
    """The toy engine, wrapped so a test can plant a KV-cache fault in a target's contexts."""
    be = FaultyToy(MatrixToy(), name="matrix-toy")
    register_backend("matrix-toy", lambda: be)
    yield be
    unregister_backend("matrix-toy")


def _map(path: Path, targets, *, widths=range(1, 7), settings=None) -> Path:
    with Session() as s:
        km = kernel_map(s, targets, [list(p.tokens) for p in TOY_PROMPTS], widths=widths, positions=24,
                        settings=settings or EngineSettings(), backend="matrix-toy")
    return km.save(path)


def toy_spec(**kw) -> MatrixSpec:
    d = dict(targets=["dispatch:4:1.0"], drafters=["dispatch:99:0"], n_max=[1, 2, 3, 5], p_min=[0.0],
             flash_attn=["auto"], prompts=list(TOY_PROMPTS), max_tokens=16, ignore_eos=True, diagnose=False,
             backend="matrix-toy")
    d.update(kw)
    return MatrixSpec(**d)


def test_cells_below_the_planted_width_are_proven_lossless_and_identical(toy_engine, tmp_path: Path):
    """A kernel switch planted at width 4: n_max 1-2 verify at widths 1-3 (proven), n_max 3 and 5 reach width 4."""
    km = _map(tmp_path / "k.json", ["dispatch:4:1.0"])
    run = run_matrix(toy_spec(kernel_map=str(km)), out=tmp_path / "m.json")
    doc = load_matrix(tmp_path / "m.json")
    assert doc["kernel_map"]["file"] == str(km) and doc["spec"]["kernel_map"] == str(km)
    assert doc["kernel_map"]["targets"][0]["safe_n_max"] == 2
    for c in doc["cells"]:
        p = c["kernel_prediction"]
        n = c["params"]["n_max"]
        if n <= 2:
            assert p["status"] == "proven-lossless" and p["widths"] == list(range(1, n + 2))
            assert c["identical"], c  # what the map proves, the run shows
        else:
            assert p["status"] == "kernels-differ" and p["first_differing"] == 4
            assert p["identical_share"] == 0.0 and p["max_delta"] > 0
    assert any(not c["identical"] for c in doc["cells"])  # the planted switch is big enough to fork somewhere
    text = "\n".join(doc["summary"])
    assert "The kernel map k.json proves n_max ≤ 2 lossless for dispatch:4:1.0; its 4 cells at n_max ≤ 2 are " \
           "identical, as predicted." in text
    assert "For dispatch:4:1.0 the map finds width 4 differing from single-token passes" in text
    assert "CONTRADICT" not in text
    rates = {g["params"]["n_max"]: g["kernel_map"] for g in doc["rates"]["settings"]}
    assert rates[1]["status"] == rates[2]["status"] == "proven-lossless" and rates[5]["status"] == "kernels-differ"
    assert all(r["contradictions"] == 0 for r in rates.values())
    assert run.kernel_map is not None


def test_a_planted_state_bug_contradicts_the_map(toy_engine, tmp_path: Path):
    """The map (made on clean contexts) proves n_max <= 4 lossless; a rollback that keeps a rejected draft then
    forks cells the map proves lossless: each is reported, loudly, as a contradiction."""
    from specview.core.report import matrix_html, matrix_markdown

    from test_report import check_html, check_markdown

    km = _map(tmp_path / "k.json", ["dispatch:9:1.0"])
    toy_engine.faults["dispatch:9:1.0"] = "keep-rejected"
    s = toy_spec(targets=["dispatch:9:1.0"], drafters=["0:2.0"], n_max=[3], diagnose=True, kernel_map=str(km))
    run_matrix(s, out=tmp_path / "m.json", traces_dir=tmp_path / "traces")
    doc = load_matrix(tmp_path / "m.json")
    forks = [c for c in doc["cells"] if not c["identical"]]
    assert forks and all(c["kernel_prediction"]["status"] == "proven-lossless" for c in doc["cells"])
    lines = [x for x in doc["summary"] if x.startswith("CONTRADICTION")]
    assert len(lines) == len(forks)
    for line, c in zip(lines, forks):
        assert f"forks at token {c['first_mismatch']}" in line
        assert "a state bug or a shape the map did not measure" in line
        assert "run `specview run --serial-verify` with these settings" in line
        assert "Its diagnosis: state bug" in line  # the serial-verify control agrees: the cache is wrong
    assert f"and {len(forks)} CONTRADICT" in "\n".join(doc["summary"])
    assert all(g["kernel_map"]["contradictions"] for g in doc["rates"]["settings"] if g["forks"])
    page = matrix_html(doc)
    check_html(page, bold=0)
    assert page.count("class=contra") == len(forks)  # the report's kernel map section shows each one
    md = matrix_markdown(doc)
    check_markdown(md)
    assert md.count("⚠ CONTRADICTION") == len(forks)
    # the trace report of one such cell, with the map, says the same of its own fork
    out = tmp_path / "rep"
    assert cli.main(["report", str(tmp_path / forks[0]["trace"]) if not Path(forks[0]["trace"]).is_absolute()
                     else forks[0]["trace"], "--kernel-map", str(km), "-o", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    check_html(page)
    assert "<h2>Kernel map</h2>" in page and "class=contra" in page and "CONTRADICTION: this run forks" in page
    assert "a state bug or a shape the map did not measure" in (out / "report.md").read_text(encoding="utf-8")


def test_cells_under_other_settings_or_threads_are_not_covered(toy_engine, tmp_path: Path):
    km = _map(tmp_path / "k.json", ["dispatch:4:1.0"], settings=EngineSettings(threads=1))
    doc = run_matrix(toy_spec(kernel_map=str(km), n_max=[1], engine=EngineSettings(threads=1)),
                     out=tmp_path / "a.json").to_json()
    assert {c["kernel_prediction"]["status"] for c in doc["cells"]} == {"proven-lossless"}
    doc = run_matrix(toy_spec(kernel_map=str(km), n_max=[1], engine=EngineSettings(threads=2)),
                     out=tmp_path / "b.json").to_json()
    assert {c["kernel_prediction"]["status"] for c in doc["cells"]} == {"not-covered"}
    assert "the map ran dispatch:4:1.0 with 1 thread(s), this run with 2" in "\n".join(doc["summary"])
    doc = run_matrix(toy_spec(kernel_map=str(km), n_max=[1], flash_attn=["on"], engine=EngineSettings(threads=1)),
                     out=tmp_path / "c.json").to_json()
    assert {c["kernel_prediction"]["status"] for c in doc["cells"]} == {"not-covered"}
    text = "\n".join(doc["summary"])
    assert "does not cover 2 cells" in text and "flash_attn on here, auto in the map" in text
    doc = run_matrix(toy_spec(kernel_map=str(km), targets=["dispatch:5:1.0"], n_max=[1],
                              engine=EngineSettings(threads=1)), out=tmp_path / "d.json").to_json()
    assert "no row for dispatch:5:1.0" in "\n".join(doc["summary"])


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"schema": "specview.matrix/1"}', "not a specview kernel map"),
    ('{"schema": "specview.kernels/1", "backend": "x", "widths": [1], "positions": 2, "top_k": 8, '
     '"prompts": [], "targets": [{"widths": [{"width": 1}], "prompts": []}]}', "malformed kernel map"),
])
def test_a_bad_kernel_map_is_refused_at_the_start_naming_the_file(tmp_path: Path, capsys, content, words):
    f = tmp_path / "k.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(MatrixError) as e:
        run_matrix(spec(kernel_map=str(f)), FakeSession(), out=tmp_path / "m.json")
    assert str(f) in str(e.value) and words in str(e.value)
    assert not (tmp_path / "m.json").exists()  # refused before any cell ran
    rc = cli.main(["matrix", "--targets", "demo:Q8_0", "--drafters", "none", "-p", "Hi", "--kernel-map", str(f),
                   "-o", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2 and str(f) in err and words in err and "Traceback" not in err
    t = tmp_path / "m.toml"
    t.write_text('targets = ["demo:Q8_0"]\nkernel_map = "k.json"\n', encoding="utf-8")
    with pytest.raises(MatrixError) as e:
        load_spec(t).validate()
    assert str(t) in str(e.value) and str(f) in str(e.value)  # relative to the TOML file's folder


def test_the_toml_key_and_the_dry_run(toy_engine, tmp_path: Path, capsys):
    km = _map(tmp_path / "k.json", ["dispatch:4:1.0"], widths=range(1, 4))
    t = tmp_path / "m.toml"
    t.write_text('n_max = [2, 3]\nkernel_map = "k.json"\nbackend = "matrix-toy"\n'
                 'prompts = [{tokens = [1, 5, 9], name = "p"}]\n', encoding="utf-8")
    s = load_spec(t)
    assert s.kernel_map == str(km)  # relative to the TOML file's folder
    assert cli.main(["matrix", "--config", str(t), "--targets", "dispatch:4:1.0", "--drafters", "dispatch:99:0",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "n_max=2 p_min=0 · fa=auto · p  map: proven-lossless (widths 1-3)" in out
    assert "n_max=3 p_min=0 · fa=auto · p  map: not-covered (width 4 was not mapped" in out
    assert f"kernel map {km}: widths 1-3" in out


def test_matrix_files_with_predictions_are_checked_and_plain_ones_unchanged(toy_engine, tmp_path: Path):
    km = _map(tmp_path / "k.json", ["dispatch:4:1.0"])
    run_matrix(toy_spec(kernel_map=str(km), n_max=[1]), out=tmp_path / "m.json")
    doc = load_matrix(tmp_path / "m.json")
    plain = run_matrix(spec(), FakeSession(), out=tmp_path / "p.json").to_json()
    assert "kernel_map" not in plain and "kernel_map" not in plain["spec"]
    assert all("kernel_prediction" not in c for c in plain["cells"])
    for path, value, words in [
        (("cells", 0, "kernel_prediction", "status"), "probably", "must be one of proven-lossless"),
        (("cells", 0, "kernel_prediction", "widths"), [1, "2"], "kernel_prediction.widths[1] must be an integer"),
        (("cells", 0, "kernel_prediction", "caveats"), [3], "caveats[0] must be a text"),
        (("cells", 0, "kernel_prediction"), "proven", "kernel_prediction must be a object"),
        (("kernel_map",), ["k.json"], "kernel_map must be a object"),
        (("kernel_map", "file"), None, "kernel_map.file must be the kernel map's file name"),
        (("kernel_map", "targets"), [{"safe_n_max": "2"}], "safe_n_max must be an integer"),
        (("spec", "kernel_map"), 7, "spec.kernel_map must be a file name"),
    ]:
        bad = json.loads(json.dumps(doc))
        parent = bad
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = value
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(MatrixError) as e:
            load_matrix(tmp_path / "bad.json")
        assert words in str(e.value) and str(tmp_path / "bad.json") in str(e.value), str(e.value)


def test_resume_predicts_the_kept_cells_from_the_map_given(toy_engine, tmp_path: Path):
    km = _map(tmp_path / "k.json", ["dispatch:4:1.0"])
    out = tmp_path / "m.json"
    s = toy_spec(n_max=[1, 3])
    first = run_matrix(s, out=out, cancel=lambda: len(json.loads(out.read_text())["cells"]) >= 2).to_json()
    assert first["status"] == "interrupted" and all("kernel_prediction" not in c for c in first["cells"])
    run_matrix(toy_spec(n_max=[1, 3], kernel_map=str(km)), out=out, resume=load_matrix(out))
    doc = load_matrix(out)
    assert doc["status"] == "complete"
    assert all(c["kernel_prediction"]["map_file"] == str(km) for c in doc["cells"])
    assert {c["params"]["n_max"]: c["kernel_prediction"]["status"] for c in doc["cells"]} == {
        1: "proven-lossless", 3: "kernels-differ"}
