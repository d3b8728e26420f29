"""The resolution has one caller: the Runner base.  Nothing else in specview imports core.resolve's resolve
functions, and no engine decides a setting the resolution decides."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "specview"
RESOLVERS = {"resolve", "resolve_engine", "resolve_settings", "_settle"}
#: the one module that may call them (core/resolve.py defines them)
DOOR = {"core/registry.py", "core/resolve.py"}


def resolver_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of every import of a resolve function from specview.core.resolve in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "resolve":
            out += [(node.lineno, a.name) for a in node.names if a.name in RESOLVERS]
    return out


def test_the_checker_finds_an_import_of_resolve():
    assert resolver_imports("from ..core.resolve import Resolved, resolve\n") == [(1, "resolve")]
    assert resolver_imports("from specview.core.resolve import resolve_engine as r\n") == [(1, "resolve_engine")]
    assert resolver_imports("from ..core.resolve import Resolved, decided\n") == []


def test_only_the_runner_base_calls_the_resolution():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in DOOR:
            continue
        found += [f"specview/{rel}:{line} imports {name}" for line, name in resolver_imports(path.read_text())]
    assert not found, "ask Runner.resolve / Runner.resolve_settings instead:\n" + "\n".join(found)


def test_an_undecided_setting_cannot_reach_a_load():
    from specview.core.config import EngineSettings
    from specview.core.registry import Runner
    from specview.core.resolve import DecidedSettings, require_decided

    with pytest.raises(TypeError, match="DecidedSettings"):
        require_decided(EngineSettings(), "a load")
    with pytest.raises(TypeError, match="no_repack"):
        DecidedSettings()  # every setting the machine may decide left unset
    got, _ = Runner.resolve_settings(EngineSettings(), backend="no-such-engine-here")  # nothing decides
    assert isinstance(got, DecidedSettings) and got == EngineSettings(no_repack=False, rollback="auto")
    assert hash(got) == hash(EngineSettings(no_repack=False, rollback="auto"))
