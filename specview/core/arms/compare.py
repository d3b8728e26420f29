"""Compare two arms: identical, or where they first fork.

The comparison is part of the trace, so it is computed where the trace is
defined (:meth:`specview.core.trace.Comparison.of`, which also checks a loaded
trace's comparison against its arms); this module keeps the names callers use.
"""

from __future__ import annotations

from ..trace import ArmResult, Comparison, first_difference

__all__ = ["compare_arms", "first_difference"]


def compare_arms(vanilla: ArmResult, speculative: ArmResult) -> Comparison:
    """Compare two arms token by token (see :meth:`Comparison.of`)."""
    return Comparison.of(vanilla, speculative)
