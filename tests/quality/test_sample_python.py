"""The frozen app as the sandbox's interpreter (``specview.core.sample_python``).

The desktop bundle has no ``python`` to start a sample with, so the sandbox starts the app itself with
``SAMPLE_ARG``. These tests stand a frozen app in with ``packaging/launcher.py`` (the bundle's own entry
point) behind a shell script, which is what ``sys.executable`` is in the bundle, and check that a sample
run there gets what ``python -I -S -c`` gives it from a pip install: the same output, the same fences,
the standard library and nothing else. ``tests/bundle/test_bundle.py`` checks the real bundle the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stdlib_only import EXPECTED, IMPORTS, LIMITS, ROOT, frozen_stand_in

from specview.core.quality.execute import SampleResult, interpreter, run_sample
from specview.core.sample_python import SAMPLE_ARG

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's fences are Linux's")


def as_frozen(monkeypatch: pytest.MonkeyPatch, exe: str, program: str) -> SampleResult:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", exe)
    assert interpreter() == [exe, SAMPLE_ARG]
    return run_sample(program, limits=LIMITS)


def test_from_a_pip_install_a_sample_sees_the_standard_library_alone() -> None:
    assert interpreter() == [sys.executable, "-I", "-S", "-c"]
    res = run_sample(IMPORTS, limits=LIMITS)
    assert res.passed, res
    assert res.output == EXPECTED


def test_the_frozen_app_runs_a_sample_as_python_i_s_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plain = run_sample(IMPORTS, limits=LIMITS)
    res = as_frozen(monkeypatch, frozen_stand_in(tmp_path), IMPORTS)
    assert res.passed, res
    # numpy, specview and Qt are importable in the app's own process; the sample sees none of them
    assert res.output == plain.output == EXPECTED
    assert res.fences is not None and plain.fences is not None
    assert res.fences.lines(LIMITS) == plain.fences.lines(LIMITS)
    assert res.fences.missing() == plain.fences.missing()


def test_a_failing_sample_in_the_frozen_app_fails_with_its_own_error(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    program = "def f(x):\n    return x + 1\nassert f(1) == 3, 'f(1) is not 3'\n"
    plain = run_sample(program, limits=LIMITS)
    res = as_frozen(monkeypatch, frozen_stand_in(tmp_path), program)
    assert not res.passed and not plain.passed
    assert res.reason == plain.reason and "f(1) is not 3" in res.output + res.reason, res


def test_the_app_refuses_sample_mode_without_code() -> None:
    import subprocess

    res = subprocess.run([sys.executable, str(ROOT / "packaging" / "launcher.py"), SAMPLE_ARG],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert res.returncode != 0 and f"{SAMPLE_ARG} needs the code to run" in res.stderr
