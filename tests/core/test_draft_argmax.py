"""The drafter's argmax (p_min <= 0) drafts what the top-10 softmax drafts, ties and NaNs included, and topk keeps
the lowest ids of a tie however many tie."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
from fakes import N_VOCAB, FakeEngine, ToyModel

from specview.core.arms import drafters
from specview.core.arms.drafters import ModelDrafter
from specview.core.arms.topk import topk


def _sorted_topk(row: np.ndarray, k: int) -> list[int]:
    """The reference: a full sort by value descending, then id ascending (NaNs left out)."""
    return sorted((i for i in range(len(row)) if row[i] == row[i]), key=lambda i: (-row[i], i))[:k]


@pytest.mark.parametrize("seed", range(20))
def test_topk_keeps_the_lowest_ids_when_more_tie_than_fit(seed):
    rng = np.random.default_rng(seed)
    row = rng.integers(0, 4, size=300).astype(np.float32)  # dozens of ids share each of four values
    for k in (1, 3, 10, 40, 299):
        ids, vals = topk(row, k)
        assert ids.tolist() == _sorted_topk(row, k), k
        assert vals.tolist() == [row[i] for i in ids]


def test_topk_with_infinities_tied_at_the_top():
    row = np.full(50, -np.inf, dtype=np.float32)
    row[[7, 30, 12, 44]] = np.inf
    assert topk(row, 2)[0].tolist() == [7, 12]
    assert topk(row, 6)[0].tolist() == [7, 12, 30, 44, 0, 1]


class RowModel(ToyModel):
    """Rows with many ties (values on a coarse grid) and, now and then, a NaN or an infinity."""

    def logits(self, prefix: Sequence[int], T: int = 1) -> np.ndarray:
        rng = np.random.default_rng(abs(hash(tuple(prefix))) % (1 << 32))
        row = rng.integers(0, 3, size=N_VOCAB).astype(np.float32)
        pick = rng.integers(0, 8)
        if pick == 0:
            row[rng.integers(0, N_VOCAB)] = np.nan
        elif pick == 1:
            row[rng.integers(0, N_VOCAB, size=3)] = np.inf
        return row


def _rounds(p_min: float) -> list[list[int]]:
    d = ModelDrafter(FakeEngine(RowModel(0)), n_max=6, p_min=p_min)
    d.begin([1, 5])
    history, out = [1, 5], []
    for r in range(80):
        got = d.draft(history, 9 + r % 5, 6)
        out.append(got)
        history = history + [9 + r % 5] + got[: r % 3]
    return out


def test_argmax_and_top_ten_paths_agree_token_for_token():
    """The same rounds drafted with p_min 0 (argmax) and with a p_min so low it never stops a draft but takes
    the top-10 path for every token."""
    a, b = _rounds(0.0), _rounds(1e-30)
    assert a == b
    assert sum(map(len, a)) == 80 * 6  # nothing stopped a draft: every round drafted n_max tokens


def test_p_min_zero_takes_the_argmax_and_only_a_nan_row_the_top_ten(monkeypatch):
    seen: list[bool] = []
    real = drafters.top_softmax
    monkeypatch.setattr(drafters, "top_softmax", lambda row, k=10: seen.append(bool(np.isnan(row).any()))
                        or real(row, k))
    drafted = sum(map(len, _rounds(0.0)))
    assert seen and all(seen)  # some rows held a NaN, and only those went through the top-10
    assert len(seen) < drafted / 4
