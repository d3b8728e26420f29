"""Reusing a vanilla arm already run with the same settings, as a matrix does across its speculative cells."""

from __future__ import annotations

from typing import Any, Callable

from ..trace import ArmResult


def replay(arm: ArmResult, on_event: Callable[[str, Any], None] | None) -> ArmResult:
    """``arm``, a cached vanilla arm, after handing each of its steps to ``on_event`` as if it ran again."""
    if on_event:
        for step in arm.steps:
            on_event("vanilla", step)
    return arm
