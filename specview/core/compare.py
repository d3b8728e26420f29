"""Compare two token sequences: identical, or where they first fork."""

from __future__ import annotations

from typing import Sequence

from .trace import ArmResult, Comparison, Mismatch


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, counting a length difference; None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def compare_arms(vanilla: ArmResult, speculative: ArmResult) -> Comparison:
    """Compare two arms token by token.

    Arms that stop at different lengths (one hit EOS, one was cancelled) but agree
    on every token they share are *not* identical; the mismatch is at the shorter
    length with ``None`` for the arm that has no token there.
    """
    i = first_difference(vanilla.tokens, speculative.tokens)
    if i is None:
        n = len(vanilla.tokens)
        return Comparison(True, n, n, n, None)

    def tok(arm: ArmResult) -> tuple[int | None, str | None]:
        if i < len(arm.tokens):
            return arm.tokens[i], arm.steps[i].piece if i < len(arm.steps) else None
        return None, None

    vt, vp = tok(vanilla)
    st, sp = tok(speculative)
    char_offset = sum(len(s.piece) for s in vanilla.steps[:i])
    return Comparison(
        identical=False,
        agree=i,
        n_vanilla=len(vanilla.tokens),
        n_speculative=len(speculative.tokens),
        first_mismatch=Mismatch(
            index=i,
            char_offset=char_offset,
            vanilla_token=vt,
            speculative_token=st,
            vanilla_piece=vp,
            speculative_piece=sp,
        ),
    )
