"""The built-in prompt suite as a matrix: one setting over many prompts, for a divergence rate.

``specview matrix --suite`` runs every suite prompt (``resources/suite/suite.toml``,
each tagged with a category) on the chosen settings.  A rate needs only each
cell's fork, not its whole text, so suite cells stop their speculative arm
:data:`STOP_AFTER_FORK` tokens after the fork unless full texts are asked for.
"""

from __future__ import annotations

from typing import Iterable

from ..config import RunConfig, default_of, field_of
from ..prompts import SUITE_CATEGORIES, PromptError, PromptSpec, suite_prompts
from .spec import MatrixError

#: tokens a suite cell's speculative arm keeps generating after its fork (enough to show it in context)
STOP_AFTER_FORK = 16
#: tokens per arm in a suite cell: a single run's default
SUITE_MAX_TOKENS = default_of(field_of(RunConfig, "max_tokens"))


def suite(categories: Iterable[str] | None = None) -> list[PromptSpec]:
    """The suite's prompts, all or those of ``categories``; MatrixError on an unknown category."""
    try:
        return suite_prompts(categories)
    except PromptError as exc:
        raise MatrixError(str(exc)) from None


__all__ = ["STOP_AFTER_FORK", "SUITE_MAX_TOKENS", "SUITE_CATEGORIES", "suite"]
