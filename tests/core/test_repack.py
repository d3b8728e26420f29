"""--no-repack as a setting, derived everywhere, and the machine's no-repack default from the crash probe.

This machine may have no AMX, so the crash path is planted: a probe result
faked in the cache (or the probe function replaced), then the real commands'
parsing and a real run on the tiny model say what they did.
"""

from __future__ import annotations

import functools
import json
from dataclasses import fields

import pytest

from specview.backends.llama_cpp import probe
from specview.cli import build_parser, main
from specview.commands import common, kernels
from fakes import FakeBackend
from specview.commands.run import resolved_from_args
from specview.core.config import EngineSettings, RunConfig, axes
from specview.core.registry import Runner, register_backend, unregister_backend
from specview.core.resolve import decided
from specview.core.llama_flags import engine_flags, server_argv

RUN_PROBE = probe.run_probe
CRASHED = {"crashed": True, "signal": "SIGSEGV", "exitcode": -11, "n_tokens": 4}


@pytest.fixture
def crashed_here(monkeypatch, tmp_path):
    """This machine as an AMX one whose probe crashed: the result planted in a fresh cache (the probe's own
    door; a planted $SPECVIEW_REPACK_PROBE would stand in front of it)."""
    monkeypatch.delenv(probe.PLANT_VARIABLE, raising=False)
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)
    probe.CACHE.put(probe.identity_key(probe.build_identity()), dict(CRASHED))
    return CRASHED


def _run_args(*argv):
    return build_parser("run").parse_args(common.join_dash_values(["run", *argv]))


# -- the setting, derived ------------------------------------------------------------------
def test_no_repack_is_an_axis_and_a_flag_with_an_explicit_off():
    assert "no_repack" in axes()
    assert _run_args().no_repack is None  # not given: the machine decides
    assert _run_args("-nr").no_repack is True
    assert _run_args("--no-repack").no_repack is True
    assert _run_args("--repack").no_repack is False
    assert "no_repack" in common.given_settings(_run_args("--repack"), EngineSettings)
    assert "no_repack" not in common.given_settings(_run_args(), EngineSettings)


def test_matrix_and_kernel_map_take_repack_on_and_off_as_an_axis():
    a = build_parser("kernels").parse_args(["kernels", "-nr", "true,false", "-fa", "on,off"])
    got = [(s.flash_attn, s.no_repack) for s in kernels.settings_from_args(a)]
    assert got == [("on", True), ("on", False), ("off", True), ("off", False)]
    a = build_parser("matrix").parse_args(["matrix", "-nr", "--repack"])
    assert a.no_repack == [[True], [False]]
    with pytest.raises(SystemExit):
        build_parser("matrix").parse_args(["matrix", "-nr", "maybe"])


def test_server_args_take_a_value_that_starts_with_a_dash():
    assert _run_args("--server-args", "--no-repack").server_args == "--no-repack"
    assert _run_args("--server-args", "-nr -ngld 0", "-n", "4").server_args == "-nr -ngld 0"
    assert common.join_dash_values(["run", "--server-args", "-x", "--", "--server-args", "-y"]) == \
        ["run", "--server-args=-x", "--", "--server-args", "-y"]
    p = build_parser("matrix")
    assert p.parse_args(common.join_dash_values(["matrix", "--server-args", "--no-repack"])).server_args == \
        "--no-repack"


def test_llama_server_and_the_report_get_no_repack():
    cfg = RunConfig(prompt="x", engine=EngineSettings(no_repack=True)).to_dict()
    assert "--no-repack" in engine_flags(cfg)
    assert "--no-repack" in server_argv(cfg, target="t.gguf", speculative=False)
    assert "--no-repack" not in engine_flags(RunConfig(prompt="x").to_dict())


def test_the_model_cache_key_tells_repacked_from_plain_weights():
    from specview.backends.llama_cpp import LlamaBackend

    be = LlamaBackend()
    plain, nr = (Runner.resolve_settings(EngineSettings(no_repack=v), backend="llama.cpp")[0] for v in (False, True))
    assert be.model_key("a.gguf", plain) != be.model_key("a.gguf", nr)
    with pytest.raises(TypeError, match="DecidedSettings"):  # an undecided setting never reaches a load
        be.model_key("a.gguf", EngineSettings())
    with pytest.raises(TypeError, match="DecidedSettings"):
        be.load("a.gguf", EngineSettings(no_repack=True))


def test_the_reason_travels_with_the_resolved_config_not_on_the_settings(crashed_here):
    assert "no_repack_reason" not in {f.name for f in fields(EngineSettings)}
    cfg = RunConfig(prompt="x")
    assert cfg.engine.no_repack is None  # unset: the machine decides when the run is resolved
    r = Runner.resolve(cfg)
    assert r.config.engine.no_repack is True and "SIGSEGV" in r.why("no_repack")
    assert r.to_dict() == {"no_repack": {"value": True, "why": r.why("no_repack")}}
    assert Runner.resolve(r) is r  # resolving a resolved config changes nothing
    # a trace's config block carries the reason beside the value; an old trace kept it in the engine block
    block = dict(r.config.to_dict(), decided=r.to_dict())
    assert decided(block, "no_repack") == r.why("no_repack")
    assert RunConfig.from_dict(block) == r.config  # read back: the value, not the reason
    old = RunConfig(prompt="x", engine=EngineSettings(no_repack=True)).to_dict()
    old["engine"]["no_repack_reason"] = "crashed long ago"
    assert decided(old, "no_repack") == "crashed long ago" and RunConfig.from_dict(old).engine.no_repack is True


def test_unset_settings_take_their_plain_value_where_nothing_decides(monkeypatch):
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: False)
    r = Runner.resolve(RunConfig(prompt="x"))
    assert r.config.engine.no_repack is False and r.decisions == ()


def test_a_decision_says_why_and_the_demo_default_kept_is_none(monkeypatch):
    from specview.backends.llama_cpp import backend as llama_backend
    from specview.backends.llama_cpp.demo_pick import DemoPick
    from specview.core.resolve import Decision

    with pytest.raises(ValueError, match="needs its one line of why"):
        Decision("target", "demo:Q4_K_M", " ")
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: False)
    picks = {"demo:Q4_K_M": DemoPick(target="demo:Q4_K_M"),  # the default forks here: kept, nothing to say
             "demo:BF16": DemoPick(target="demo:BF16", reason="demo:BF16 instead of demo:Q4_K_M: (measured)")}
    for want, pick in picks.items():
        monkeypatch.setattr(llama_backend, "cached_pick", lambda settings, default, p=pick: p)
        r = Runner.resolve(RunConfig(prompt="x"), default_target=True, measure=False)
        assert r.config.target == want
        assert r.to_dict() == ({} if not pick.reason else {"target": {"value": want, "why": pick.reason}})


# -- the machine's default ------------------------------------------------------------------
def test_a_crashed_probe_makes_runs_default_to_no_repack_and_say_why(crashed_here, tiny_target):
    r = resolved_from_args(_run_args("-m", str(tiny_target), "--spec-type", "ngram-simple"))
    assert r.config.engine.no_repack is True
    assert "SIGSEGV" in r.why("no_repack") and "#20824" in r.why("no_repack")


@pytest.mark.parametrize("flag, want", [("--repack", False), ("-nr", True)])
def test_an_explicit_choice_wins_over_the_probe(crashed_here, tiny_target, flag, want):
    r = resolved_from_args(_run_args("-m", str(tiny_target), "--spec-type", "ngram-simple", flag))
    assert r.config.engine.no_repack is want
    assert r.why("no_repack") == "" and r.decisions == ()


def test_no_crash_no_default(monkeypatch, tmp_path, tiny_target):
    monkeypatch.delenv(probe.PLANT_VARIABLE, raising=False)
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)
    probe.CACHE.put(probe.identity_key(probe.build_identity()), {"crashed": False, "ok": True})
    r = resolved_from_args(_run_args("-m", str(tiny_target), "--spec-type", "ngram-simple"))
    assert r.config.engine.no_repack is False and r.decisions == ()


def test_other_engines_are_left_alone(crashed_here):
    register_backend("repack-toy", FakeBackend)
    try:
        s, decisions = Runner.resolve_settings(EngineSettings(), backend="repack-toy")
    finally:
        unregister_backend("repack-toy")
    assert s.no_repack is False and decisions == ()


def test_a_run_prints_and_records_the_reason(crashed_here, tiny_target, tmp_path, capsys):
    out = tmp_path / "t.json"
    code = main(["run", "-m", str(tiny_target), "--spec-type", "ngram-simple", "-p", "hello", "-n", "6",
                 "--no-diagnose", "-q", "--json", str(out)])
    assert code in (0, 1)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("repack ")]
    assert len(lines) == 1 and "SIGSEGV" in lines[0]
    cfg = json.loads(out.read_text())["config"]
    assert cfg["engine"]["no_repack"] is True and "SIGSEGV" in cfg["decided"]["no_repack"]["why"]
    assert "no_repack_reason" not in cfg["engine"]


@pytest.mark.parametrize("in_worker", [False, True])
def test_a_session_built_in_code_gets_the_machines_decision(crashed_here, tiny_target, in_worker, monkeypatch):
    """The library use: no CLI and no app, only a Session (here, or behind the registry's worker) and a config."""
    from specview.core.session import Session
    from specview.core.registry import get_backend

    monkeypatch.setenv("SPECVIEW_WORKER", "1" if in_worker else "0")
    cfg = RunConfig(target=str(tiny_target), spec_type="ngram-simple", prompt="hello", max_tokens=4)
    runner = get_backend("llama.cpp").runner() if in_worker else Session()
    with runner:
        trace = runner.run(cfg)
        assert type(runner).__name__ == ("WorkerRunner" if in_worker else "Session")
    assert trace.config["engine"]["no_repack"] is True
    assert "SIGSEGV" in decided(trace.config, "no_repack")
    assert trace.models["target"]["no_repack"] is True  # the model really was loaded without repacking


def test_the_report_and_the_card_rows_say_it():
    from types import SimpleNamespace

    from specview.core.report.facts import config_facts

    cfg = RunConfig(prompt="x", engine=EngineSettings(no_repack=True)).to_dict()
    cfg["decided"] = {"no_repack": {"value": True, "why": "crashed here"}}
    env = {"setup": {"machine.cpu_features": ["AVX2", "AMX"]}, "cpu": "Xeon"}
    rows = dict(config_facts(SimpleNamespace(config=cfg, environment=env)))
    assert rows["weight repack"] == "off (--no-repack): crashed here"
    assert rows["CPU features"] == "AVX2, AMX"
    asked = RunConfig(prompt="x", engine=EngineSettings(no_repack=True)).to_dict()
    assert dict(config_facts(SimpleNamespace(config=asked, environment={})))["weight repack"] == \
        "off (--no-repack, as asked)"
    rows = dict(config_facts(SimpleNamespace(config=RunConfig(prompt="x").to_dict(), environment={})))
    assert rows["weight repack"].startswith("on") and "CPU features" not in rows


# -- the probe's cache ----------------------------------------------------------------------
def test_the_probe_runs_once_per_build_and_cpu(monkeypatch, tmp_path):
    from specview.core.errors import EngineCrashed

    # the real probe and its cache, with its worker planted: a planted $SPECVIEW_REPACK_PROBE would stand in front
    monkeypatch.delenv(probe.PLANT_VARIABLE, raising=False)
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)
    calls = []

    def isolate(fn, *args, timeout=None):
        calls.append(fn)
        raise EngineCrashed("worker died", crash={"signal": "SIGSEGV", "exitcode": -11})

    monkeypatch.setattr(probe, "run_probe", functools.partial(RUN_PROBE, isolate=isolate))
    assert probe.repack_decision(EngineSettings()).value is True
    assert probe.repack_decision(EngineSettings()).value is True
    assert len(calls) == 1  # the second answer came from the cache
    ident = dict(probe.build_identity(), libllama_mtime=0)  # another build
    monkeypatch.setattr(probe, "build_identity", lambda flags=None: ident)
    assert probe.cached_result() is None


def test_where_the_probe_is_not_needed_it_never_runs(monkeypatch):
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: False)
    monkeypatch.setattr(probe, "run_probe", lambda **kw: pytest.fail("the probe ran"))
    assert probe.probe_result() is None
    assert probe.repack_decision(EngineSettings()) is None


def test_amx_is_read_from_the_cpu_flags():
    from specview.core.doctor import cpu_flags, has_amx, kernel_features

    info = "processor : 0\nflags\t\t: fpu sse2 avx2 avx512f avx_vnni amx_bf16 amx_tile amx_int8\n"
    flags = cpu_flags(info)
    assert has_amx(flags) and kernel_features(flags) == ["AVX2", "AVX-512", "AVX-VNNI", "AMX"]
    arm = cpu_flags("Features\t: fp asimd evtstrm aes crc32 asimddp\n")
    assert not has_amx(arm) and kernel_features(arm) == ["NEON", "DOTPROD"]
