"""Top-k of a logits row without sorting the vocabulary (O(n_vocab))."""

from __future__ import annotations

import numpy as np


def topk(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and logits of the k largest entries of ``row``, largest first.

    Ties are broken towards the lower token id, like llama.cpp's greedy sampler
    and ``np.argmax``.
    """
    n = row.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=row.dtype)
    if k < n:
        part = np.argpartition(row, n - k)[n - k:]
        edge = row[part].min()  # the k-th largest value (NaN when a NaN was picked: left as picked)
        if np.count_nonzero(row == edge) > np.count_nonzero(row[part] == edge):
            # more ids tie at the edge than fit: argpartition kept arbitrary ones, keep the lowest
            above = np.flatnonzero(row > edge)
            part = np.concatenate([above, np.flatnonzero(row == edge)[: k - above.size]])
    else:
        part = np.arange(n)
    vals = row[part]
    order = np.lexsort((part, -vals))  # by value desc, then id asc
    ids = part[order]
    return ids, row[ids]


def top_softmax(row: np.ndarray, k: int = 10) -> tuple[int, float]:
    """The top token and its probability in a softmax over the top ``k`` logits only.

    This is what llama.cpp's draft-simple compares against p_min: its draft
    sampler is a top-k of 10, so the probability is renormalised over those ten.
    """
    ids, vals = topk(row, k)
    v = vals.astype(np.float64)
    # a NaN or infinite top logit gives a NaN probability, as llama.cpp's softmax does; a NaN stops no draft
    # there (NaN < p_min is false) nor here, so it is a value, not a warning
    with np.errstate(invalid="ignore"):
        e = np.exp(v - v[0])
    return int(ids[0]), float(e[0] / e.sum())
