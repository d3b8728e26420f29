"""The neighbour trigger in-process: does a second sequence on the same weights change my answer?

specview's llama.cpp context holds one sequence, so in-process the neighbour is
a second context on the same loaded weights, decoding its own prompt with one
of its passes between every pass of mine (the weights, the backend's buffers and
the thread pool are what the two share).  Plain greedy alone and plain greedy
beside the neighbour run the same passes on contexts of the same size, so no
batch composition separates them: any difference is a leak, proven once plain
greedy alone repeats itself.  The batch-composition axis is llama-server's
(``-np 2``, :mod:`specview.backends.llama_server.neighbours`).
"""

from __future__ import annotations

import time
from typing import Any

from ..arms.compare import first_difference
from ..arms.generate import vanilla_greedy
from ..errors import Cancelled
from ..trace import Step
from .result import IDENTICAL, IN_PROCESS, STATE, UNPROVEN, TriggerResult


def beside(probe: Any, prompt: list[int], other: list[int], n_ctx: int, max_tokens: int) -> tuple[list[int], int]:
    """Plain greedy of ``prompt`` with a neighbour context decoding ``other`` between its passes; (my tokens, the
    neighbour's passes while mine ran)."""
    mine = probe.contexts.get("probe-mine", probe.settings, n_ctx, fresh=True)
    theirs = probe.contexts.get("probe-neighbour", probe.settings, n_ctx, fresh=True)
    gen_a = vanilla_greedy(mine, prompt, probe.opts(max_tokens), cancel=probe.cancel)
    gen_b = vanilla_greedy(theirs, other, probe.opts(max_tokens + 8), cancel=probe.cancel)
    tokens: list[int] = []
    interleaved = 0
    b_done = False
    try:
        next(gen_b)  # the neighbour is in flight (prefilled, its first token out) before my first pass
        while True:
            try:
                ev = next(gen_a)
            except StopIteration:
                break
            if isinstance(ev, Step):
                tokens.append(ev.token)
            if not b_done:
                try:
                    next(gen_b)
                    interleaved += 1
                except StopIteration:
                    b_done = True
    finally:
        gen_a.close()
        gen_b.close()
    if probe.cancel():
        raise Cancelled("probe cancelled")
    return tokens, interleaved


def neighbour_in_session(probe: Any, other_text: str) -> TriggerResult:
    """The neighbour row: plain greedy alone against plain greedy beside a second context (module docstring)."""
    t0 = time.perf_counter()
    prompt = probe.tokens(None)
    other = probe.tokens(other_text)
    n = probe.n
    n_ctx = ((max(len(prompt), len(other)) + n + 8 + 2 + 255) // 256) * 256
    alone = probe.vanilla(prompt, n_ctx, n).tokens[:n]
    mine, interleaved = beside(probe, prompt, other, n_ctx, n)
    d = first_difference(alone, mine)
    reached = interleaved >= len(mine) - 1 and len(mine) > 0
    what = f"the neighbour context ran {interleaved} passes between my {len(mine)}"
    row = TriggerResult("neighbour", "second context", IN_PROCESS, UNPROVEN, "", reached, len(mine), d,
                        counts={"neighbour_passes": interleaved, "my_tokens": len(mine)})
    if d is None:
        row.result = IDENTICAL if reached else UNPROVEN
        row.evidence = (f"{len(mine)}/{len(alone)} tokens equal plain greedy alone; {what}" if reached
                        else f"the neighbour was not in flight throughout: {what}")
    else:
        again = probe.vanilla(prompt, n_ctx, d + 1, fresh=True).tokens[:d + 1]
        repeats = again == alone[:d + 1]
        row.control = {"form": "plain greedy alone, again", "identical": repeats, "first_mismatch": None,
                       "n_tokens": len(again)}
        if repeats:
            row.result = STATE
            row.evidence = (f"beside the neighbour my answer forks at token {d}, and alone it repeats itself: the "
                            f"neighbour's passes reach my context; {what}")
        else:
            row.evidence = f"fork at token {d}, but plain greedy alone does not repeat itself; {what}"
    row.seconds = time.perf_counter() - t0
    return row
