"""What the tests that run ``specview quality --execute`` add for this machine's sandbox."""

from __future__ import annotations


def weak_flag() -> list[str]:
    """``--allow-weak-sandbox`` where this machine lacks a fence docs/quality-sandbox.md promises (the run is then
    refused without it, and says what it runs without), else nothing: the test runs what a user would type."""
    from specview.core.quality.execute import sandbox_report

    return ["--allow-weak-sandbox"] if sandbox_report().missing() else []
