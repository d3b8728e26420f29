"""A machine without the kernel's fences, planted: the report a real probe gives with namespaces, mounts, Landlock
and seccomp left out, put where :func:`specview.core.quality.execute.sandbox_report` finds it.

Every path that runs a suite's model-written code (``specview quality``, ``specview matrix`` over a code suite,
the app's Quality and Matrix tabs) asks that report first; the tests plant this one to see each refuse it.
"""

from __future__ import annotations

from typing import Any

from specview.core.quality import execute
from specview.core.quality.execute import Limits, SandboxReport, run_sample


def weak_report() -> SandboxReport:
    """A real probe with the kernel's fences left out: what a machine without them reports."""
    res = run_sample("pass\n", limits=Limits(), guard=False, probe=True,
                     fences_off=("namespaces", "mounts", "landlock", "seccomp"))
    assert res.passed and res.fences is not None, res
    report = SandboxReport(fences=res.fences, limits=Limits(), python="python")
    assert report.missing(), "a probe without the kernel's fences should lack a promised fence"
    return report


def plant_weak(monkeypatch: Any) -> SandboxReport:
    """Make this process's sandbox report the weak one (undone with ``monkeypatch``); returns it."""
    weak = weak_report()
    monkeypatch.setitem(execute._REPORTS, Limits(), weak)
    return weak
