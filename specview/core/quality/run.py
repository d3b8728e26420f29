"""Running a suite through both arms: each item one run on the engine's runner, scored, and diagnosed where the
answer changed.

Every item is one :meth:`Runner.run` of the base config with the item's prompt
(so every engine and every setting a run takes, a quality run takes too); the
vanilla arm's answer and the speculative arm's are scored (once, when the arms
are identical), and an item whose answer changed (one arm passes, the other
fails) has its fork diagnosed by the runner's own diagnosis (near-tie / state /
nondeterministic).  With an ``out_dir`` the result is rewritten atomically to
``out_dir/quality.json`` after every item and each item's trace is saved under
``out_dir/traces/``, so an interrupted run keeps every finished item and
``resume=True`` runs only the rest (the same rules as a matrix's ``--resume``:
the same suite and settings, the same machine, build and thread count).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import RunConfig
from ..registry import Runner
from .result import ItemOutcome, QualityResult
from .suites import Suite

#: the result file in a quality run's folder, and the folder of its traces
RESULT_FILE = "quality.json"
TRACES_DIR = "traces"
#: the key of a trace's config block that says which suite item its prompt is
QUALITY_KEY = "quality"
#: which forks are diagnosed: those of items whose answer changed (the default), every fork, or none
DIAGNOSE_CHOICES = ("discordant", "forks", "none")


@dataclass(frozen=True)
class QualityProgress:
    """Where a quality run is: ``done`` of ``total`` items (kept ones included), seconds spent, seconds left."""

    done: int
    total: int
    elapsed: float
    eta: float | None
    line: str


ProgressFn = Callable[[str], None]
ItemFn = Callable[[ItemOutcome, QualityProgress], None]


def run_quality(
    runner: Runner,
    base_config: Any,
    suite: Suite,
    *,
    execute: bool = False,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: ProgressFn | None = None,
    cancel: Callable[[], bool] | None = None,
    on_item: ItemFn | None = None,
    diagnose: str = "discordant",
    limits: Any = None,
) -> QualityResult:
    """Run every item of ``suite`` through both arms of ``base_config`` on ``runner``; return the result.

    ``base_config`` is a :class:`RunConfig` (or a :class:`~specview.core.resolve.Resolved`, whose decisions
    each trace records); each item runs it with the item's prompt.  ``execute`` allows running model-written
    code (a suite that needs it is refused without, naming ``--execute``).  ``progress`` gets one line per item
    with the ETA; ``on_item`` the outcome and a :class:`QualityProgress`.  ``cancel`` is checked between items
    and inside each run: an item cut short is not recorded and the result's status is ``interrupted``
    (KeyboardInterrupt likewise).  ``resume`` keeps the finished items of ``out_dir/quality.json`` (refused,
    naming what differs, for another suite, other settings, or another machine, build or thread count).
    ``diagnose``: one of :data:`DIAGNOSE_CHOICES`.
    """
    raise NotImplementedError


def quality_block(trace: Any) -> dict[str, Any] | None:
    """A trace's ``config.quality`` block (``{"suite", "item", "expected", "vanilla_pass", "speculative_pass"}``)
    when its prompt came from a suite, else None."""
    raise NotImplementedError


def answer_changed(trace: Any) -> bool | None:
    """Whether one arm's answer passed and the other's failed, read from the trace's ``config.quality`` block
    (a :class:`~specview.core.trace.Trace` or its JSON); None when the prompt came from no suite."""
    raise NotImplementedError


__all__ = ["DIAGNOSE_CHOICES", "QUALITY_KEY", "RESULT_FILE", "TRACES_DIR", "QualityProgress", "answer_changed",
           "quality_block", "run_quality"]
