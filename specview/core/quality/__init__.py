"""Task outcomes: does speculative decoding change answers?  Suites, scoring, the paired run and its statistics.

``specview quality`` runs a task suite through both arms, scores each arm's
answer, and reports the paired outcome (both pass, both fail, only vanilla,
only speculative), McNemar's exact test on the discordant items, each arm's
pass rate with a Wilson interval, and the fork and diagnosis of every item
whose answer changed.  ``docs/quality.md`` has the user's version.

Rooms: :mod:`.suites` (items; built-in, JSONL, HumanEval), :mod:`.extract`
(reading an answer out of a reply), :mod:`.score`, :mod:`.stats`,
:mod:`.result` (the ``specview.quality/1`` document), :mod:`.run` (the run),
and ``execute`` (the sandbox that runs model-written code).
"""

from __future__ import annotations

from .result import SCHEMA, ItemOutcome, QualityResult, Rate, Table
from .run import (DIAGNOSE_CHOICES, QUALITY_KEY, RESULT_FILE, TRACES_DIR, QualityProgress, answer_changed,
                  item_trace, outcome_words, quality_block, run_quality)
from .score import CODE_TIMEOUT, Score, program, score
from .stats import mcnemar_exact, wilson
from .suites import BUILTIN, DEFAULT_ITEMS, SUITE_NAMES, Item, QualityError, Suite, load_suite

__all__ = [
    "BUILTIN", "CODE_TIMEOUT", "DEFAULT_ITEMS", "DIAGNOSE_CHOICES", "QUALITY_KEY", "RESULT_FILE", "SCHEMA",
    "SUITE_NAMES", "TRACES_DIR", "Item", "ItemOutcome", "QualityError", "QualityProgress", "QualityResult", "Rate",
    "Score", "Suite", "Table", "answer_changed", "item_trace", "load_suite", "outcome_words", "mcnemar_exact", "program", "quality_block",
    "run_quality", "score", "wilson",
]
