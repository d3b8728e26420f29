"""The verdict's pure logic: thresholds, envelope statistics and :func:`classify` (unit-tested on numbers).

Nothing here runs a model, so an engine that diagnoses from the outside (a
llama-server, which cannot split its verify pass) calls the same
:func:`classify` with what it could measure.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import SpecviewError
from ..verdicts import RULES, VERDICTS

__all__ = [
    "VERDICTS",
    "LOGIT_TOL",
    "FAR_FACTOR",
    "FAR_FLOOR",
    "CONTROL_CHUNK",
    "SCHEMA_VERSION",
    "DiagnosisCancelled",
    "envelope_stats",
    "far_threshold",
    "at_risk_positions",
    "classify",
    "rank_of",
]

#: A replayed logit may differ from the recorded one by this much and still
#: count as reproduced.  Traces store logits rounded to 5 decimals (an error
#: of at most 5e-6); a deterministic backend reproduces them bit for bit.
LOGIT_TOL = 1e-4
#: "Far beyond the envelope" is a gap above max(FAR_FACTOR x envelope max, FAR_FLOOR).
FAR_FACTOR = 4.0
#: Near-tie forks seen in public reports have gaps of 0.000-0.125 logits; one
#: engine gates its teacher-forced worst gap at 2.0.  A gap under this floor is
#: never called a state bug on the gap alone.
FAR_FLOOR = 2.0
#: Prefill chunk used by the prefill-chunk control (1 when the run itself used 7).
CONTROL_CHUNK = 7
#: shape of the diagnosis object; 2 added ``serial_verify`` and ``reference``
SCHEMA_VERSION = 2


class DiagnosisCancelled(SpecviewError):
    """The caller's cancel check returned True; no diagnosis was recorded."""


def envelope_stats(series: Sequence[float]) -> dict[str, float | None]:
    """max, p95 and median of per-position shifts (None for an empty series)."""
    if len(series) == 0:
        return {"max": None, "p95": None, "median": None}
    a = np.asarray(series, dtype=np.float64)
    return {
        "max": float(a.max()),
        "p95": float(np.percentile(a, 95)),
        "median": float(np.median(a)),
    }


def far_threshold(env_max: float | None, *, factor: float = FAR_FACTOR, floor: float = FAR_FLOOR) -> float:
    """The gap above which a fork is not a rounding effect: max(factor x envelope max, floor).

    Why a factor: a flip moves the difference logit(a) - logit(b) by the sum of
    both replays' gaps, and two logits that each move by at most m move their
    difference by at most 2m; the fork's own shift can also exceed the largest
    one seen before it.  4 = 2 x 2 covers both.
    """
    return max(factor * (env_max or 0.0), floor)


def at_risk_positions(margins: Sequence[float], threshold: float | None) -> list[int] | None:
    """Token indices whose top-1/top-2 margin is below ``threshold`` (the envelope's max)."""
    if threshold is None:
        return None
    return [j for j, m in enumerate(margins) if m is not None and m < threshold]


def _rule(verdict: str, rule: str) -> tuple[str, str]:
    assert verdict in VERDICTS and rule in RULES, (verdict, rule)
    return verdict, rule


def classify(
    *,
    identical: bool,
    single_reproduced: bool = True,
    single_rerun_consistent: bool | None = None,
    spec_reproduced: bool = True,
    spec_rerun_consistent: bool | None = None,
    gap: float | None = None,
    env_max: float | None = None,
    factor: float = FAR_FACTOR,
    floor: float = FAR_FLOOR,
    serial_verify_identical: bool | None = None,
    vanilla_repeat_identical: bool | None = None,
    unproven: int = 0,
) -> tuple[str, str]:
    """The verdict and the rule that gave it (rule names and meanings: :data:`specview.core.verdicts.RULES`).

    ``serial_verify_identical`` is the serial-verify control: whether the
    speculative loop with every verify row computed as its own single-token
    pass (in process), or the same server with ``-ub 1``, reproduced vanilla
    token for token; None where it could not run.  ``vanilla_repeat_identical``
    is vanilla run again on a fresh context (None: not run).  ``unproven`` counts
    the speculative arm's rollbacks through a path the control never walks and
    no check proved (n_rs_seq snapshots, :func:`.controls.snapshot_check`).

    In order:

    1. identical arms are ``identical``;
    2. nondeterminism, since nothing else can be trusted without determinism:
       vanilla run twice disagrees, or an arm's two clean replays disagree;
    3. ``serial-verify-differs``: the serial loop does not reproduce vanilla,
       so the loop or its cache is wrong (``state``, proven without thresholds);
    4. an arm whose clean replays agree with each other but not with its record
       (``state``: the arm's own context was not the state its tokens imply);
    5. a gap far beyond the envelope (:func:`far_threshold`) is ``state`` even
       when the serial control reproduces vanilla: that control never runs a
       T > 1 pass, so it cannot see a bug that lives only in batched passes;
    6. ``snapshot-restore-unproven``: rollbacks the control did not cover leave
       the fork ``inconclusive``, whatever its gap under the far threshold (a
       wrong snapshot can fork on a near-tie as well as anything);
    7. ``serial-verify-reproduces-vanilla``: the fork is proven to come from
       batched-versus-single numerics (``near-tie``);
    8. without the control, the thresholds decide: ``near-tie`` within the
       envelope or below the far threshold.
    """
    if identical:
        return _rule("identical", "identical")
    if vanilla_repeat_identical is False:
        return _rule("nondeterministic", "vanilla-repeat-disagrees")
    if not single_reproduced and single_rerun_consistent is False:
        return _rule("nondeterministic", "vanilla-replays-disagree")
    if not spec_reproduced and spec_rerun_consistent is False:
        return _rule("nondeterministic", "speculative-replays-disagree")
    if serial_verify_identical is False:
        return _rule("state", "serial-verify-differs")
    if not single_reproduced:
        return _rule("state", "vanilla-unreproducible")
    if not spec_reproduced:
        return _rule("state", "speculative-unreproducible")
    if gap is None:
        if unproven:
            return _rule("inconclusive", "snapshot-restore-unproven")
        if serial_verify_identical:
            return _rule("near-tie", "serial-verify-reproduces-vanilla")
        raise ValueError("a gap (or the serial-verify control) is needed to classify a reproduced fork")
    if gap > far_threshold(env_max, factor=factor, floor=floor):
        return _rule("state", "gap-far-beyond-envelope")
    if unproven:
        return _rule("inconclusive", "snapshot-restore-unproven")
    if serial_verify_identical:
        return _rule("near-tie", "serial-verify-reproduces-vanilla")
    return _rule("near-tie", "gap-within-envelope" if env_max is not None and gap <= env_max else "gap-below-far")


def rank_of(row: np.ndarray, token: int) -> int:
    """1-based rank of ``token`` in ``row``, ties broken towards the lower id (as :func:`topk`)."""
    v = row[token]
    return int(np.count_nonzero(row > v) + np.count_nonzero(row[:token] == v) + 1)
