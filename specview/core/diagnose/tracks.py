"""Per-token tracks of a run for the plots: how far the speculative rows moved from vanilla's, and how long
the accepted drafts were by position in the draft.

* :func:`pair_tracks`, on the positions both arms computed on the same context
  (the shared prefix and the fork, :func:`~specview.core.diagnose.ties.compared_count`):

  - **Δ-margin**: how much the speculative row moved vanilla's own decision,
    ``[l_s(a) - l_s(b)] - [l_v(a) - l_v(b)]`` where ``a`` and ``b`` are
    vanilla's top-1 and top-2 and ``l_v``, ``l_s`` the two rows' logits.  The
    arms flip exactly where it is below minus vanilla's margin.  None where
    the speculative row did not record both tokens in its top-k;
  - **KL**: KL(vanilla || speculative) of the two rows' distributions over
    the candidates both rows recorded in their top-k, each renormalised over
    them: an estimate of the full-vocabulary KL, exact when both rows put all
    their mass on those candidates.  None where fewer than two are shared.

* :func:`acceptance_histogram`: over the verify rounds, how many rounds
  accepted 0, 1, ... drafts, and per position k in the draft how many rounds
  drafted at least k tokens and how many accepted at least k (the share of
  drafts that survive to position k).
"""

from __future__ import annotations

import math
from typing import Any

from .ties import compared_count


def _pairs(step: Any) -> dict[int, float]:
    out = {}
    for t, x in zip(step.top_ids or [], step.top_logits or []):
        if isinstance(x, (int, float)) and math.isfinite(x):
            out.setdefault(int(t), float(x))
    return out


def delta_margin(v: Any, s: Any) -> float | None:
    """How much the speculative row ``s`` moved vanilla row ``v``'s top-1/top-2 margin (logits)."""
    lv, ls = _pairs(v), _pairs(s)
    if len(lv) < 2:
        return None
    a, b = sorted(lv, key=lambda t: (-lv[t], t))[:2]
    if a not in ls or b not in ls:
        return None
    return (ls[a] - ls[b]) - (lv[a] - lv[b])


def top_kl(v: Any, s: Any) -> float | None:
    """KL(v || s) over the candidates both rows recorded, each renormalised over them (nats)."""
    lv, ls = _pairs(v), _pairs(s)
    common = sorted(set(lv) & set(ls))
    if len(common) < 2:
        return None
    mv, ms = max(lv[t] for t in common), max(ls[t] for t in common)
    zv = math.log(sum(math.exp(lv[t] - mv) for t in common)) + mv
    zs = math.log(sum(math.exp(ls[t] - ms) for t in common)) + ms
    kl = 0.0
    for t in common:
        pv = lv[t] - zv
        kl += math.exp(pv) * (pv - (ls[t] - zs))
    return max(kl, 0.0)


def pair_tracks(trace: Any) -> dict[str, list[float | None]]:
    """``{"delta_margin": [...], "kl": [...]}`` over the compared positions, in token order."""
    v, s = trace.vanilla.steps, trace.speculative.steps
    n = compared_count(trace)
    return {"delta_margin": [delta_margin(v[i], s[i]) for i in range(n)],
            "kl": [top_kl(v[i], s[i]) for i in range(n)]}


#: the most draft positions the histogram shows (no engine drafts more a round)
MAX_POSITIONS = 1024


def acceptance_histogram(arm: Any) -> dict[str, Any]:
    """The verify rounds' accepted lengths: ``by_length[a]`` rounds accepted ``a`` drafts; per draft position
    ``k`` (1-based, ``positions[k - 1]``), the rounds that drafted at least ``k`` and those that accepted at
    least ``k``."""
    rounds = [r for r in arm.rounds if r.index > 0]
    # a file may claim any count: past MAX_POSITIONS drafts a round is counted at the last position shown
    most = min(max((r.drafted for r in rounds), default=0), MAX_POSITIONS)
    by_length, drafted_at = [0] * (most + 1), [0] * (most + 1)
    for r in rounds:
        by_length[min(r.accepted, most)] += 1
        drafted_at[min(r.drafted, most)] += 1
    positions = []
    drafted = accepted = 0
    for k in range(most, 0, -1):  # rounds that drafted (accepted) at least k: sums from the top down
        drafted, accepted = drafted + drafted_at[k], accepted + by_length[k]
        positions.append({"position": k, "drafted": drafted, "accepted": accepted,
                          "rate": accepted / drafted if drafted else None})
    positions.reverse()
    return {"rounds": len(rounds), "by_length": by_length, "positions": positions}


__all__ = ["acceptance_histogram", "delta_margin", "pair_tracks", "top_kl"]
