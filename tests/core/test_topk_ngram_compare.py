import numpy as np
import pytest

from specview.core.arms.compare import compare_arms, first_difference
from specview.core.arms.drafters import NgramDrafter
from specview.core.arms.topk import top_softmax, topk
from specview.core.trace import ArmResult, Step


@pytest.mark.parametrize("seed", range(5))
def test_topk_matches_a_full_sort(seed):
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(5000).astype(np.float32)
    row[[10, 20]] = row.max() + 1.0  # a tie at the top: lower id first, like argmax
    ids, vals = topk(row, 8)
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:8]
    assert ids.tolist() == order
    assert vals.tolist() == [row[i] for i in order]
    assert ids[0] == np.argmax(row)


def test_top_softmax_is_over_the_top_ten_only():
    row = np.full(1000, -50.0, dtype=np.float32)
    row[:10] = 0.0  # ten equal candidates
    row[3] = 1.0
    tok, p = top_softmax(row, 10)
    assert tok == 3
    expected = np.e / (np.e + 9)
    assert p == pytest.approx(expected, rel=1e-6)
    # raise the 990 others to 0.99: the top ten are now token 3 and nine of them
    row[10:] = 0.99
    _, p2 = top_softmax(row, 10)
    assert p2 == pytest.approx(np.e / (np.e + 9 * np.exp(0.99)), rel=1e-6)
    full = np.exp(1.0) / (np.exp(1.0) + 9 * 1.0 + 990 * np.exp(0.99))
    assert p2 > 10 * full  # a full-vocabulary softmax would give a tiny probability


def reference_ngram(tokens, sampled, n, m):
    """A brute-force restatement of llama.cpp's common_ngram_simple_draft."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = list(tokens[cur - n + 1:]) + [sampled]
    for j in range(cur - n - 1, 0, -1):
        if list(tokens[j:j + len(pattern)]) == pattern:
            copy = min(m, cur - (j + n))
            return [] if copy < n else list(tokens[j + n:j + n + copy])
    return []


def test_ngram_drafter_matches_reference_on_random_repetitive_histories():
    rng = np.random.default_rng(1)
    for trial in range(300):
        base = rng.integers(0, 6, size=rng.integers(2, 12)).tolist()
        hist = (base * 20)[: rng.integers(5, 120)]
        hist = [t if rng.random() > 0.05 else 9 for t in hist]
        sampled = int(rng.integers(0, 6))
        n, m = int(rng.integers(1, 5)), int(rng.integers(1, 10))
        d = NgramDrafter(size_n=n, size_m=m)
        assert d.draft(hist, sampled, 1000) == reference_ngram(hist, sampled, n, m), (trial, hist, sampled, n, m)


def test_ngram_drafter_copies_the_continuation_of_the_last_match():
    d = NgramDrafter(size_n=2, size_m=3)
    hist = [5, 1, 2, 3, 4, 7, 8, 9, 1]
    # pattern [1, 2] (last history token + sampled) occurred at index 1; copy what followed it
    assert d.draft(hist, 2, 10) == [3, 4, 7]
    assert d.draft(hist, 2, 2) == [3, 4]  # the run's remaining budget caps it
    assert d.draft(hist, 6, 10) == []  # no match


def _arm(name, toks):
    a = ArmResult(name=name, tokens=list(toks))
    a.steps = [Step(i, t, f"<{t}>", i, [t], [0.0], 1.0) for i, t in enumerate(toks)]
    return a


def test_compare_identical_and_forks():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    c = compare_arms(_arm("vanilla", [1, 2, 3]), _arm("speculative", [1, 2, 3]))
    assert c.identical and c.agree == 3 and c.first_mismatch is None

    c = compare_arms(_arm("vanilla", [1, 2, 3, 4]), _arm("speculative", [1, 2, 9, 4]))
    assert not c.identical and c.agree == 2
    fm = c.first_mismatch
    assert (fm.index, fm.vanilla_token, fm.speculative_token) == (2, 3, 9)
    assert fm.char_offset == len("<1><2>")
    assert (fm.vanilla_piece, fm.speculative_piece) == ("<3>", "<9>")


def test_compare_a_shorter_arm_is_not_identical():
    c = compare_arms(_arm("vanilla", [1, 2, 3]), _arm("speculative", [1, 2]))
    assert not c.identical
    assert c.first_mismatch.index == 2
    assert c.first_mismatch.speculative_token is None and c.first_mismatch.vanilla_token == 3
