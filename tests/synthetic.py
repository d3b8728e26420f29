"""A synthetic trace built from the real dataclasses: the app's tests show it without running a model."""

from __future__ import annotations

from specview.core.arms.compare import compare_arms
from specview.core.trace import ArmResult, Round, Step, Trace

WORDS = ["The", " cat", " sat", " on", " the", " mat", ".", " It", " was", " warm", " and", " quiet", ",",
         " so", " it", " slept", " for", " hours", "\n", " Then"]


def _step(i: int, tok: int, *, margin: float, round_: int = 0, from_draft: bool = False, batch: int = 1,
          row: int = 0) -> Step:
    alt = (tok + 1) % len(WORDS)
    return Step(index=i, token=tok, piece=WORDS[tok], pos=10 + i, top_ids=[tok, alt, (tok + 2) % len(WORDS)],
                top_logits=[12.0, 12.0 - margin, 12.0 - margin - 1.5], margin=margin, round=round_,
                from_draft=from_draft, batch_size=batch, batch_index=row)


def synthetic_trace(n: int = 40, fork: int | None = 25, *, n_max: int = 3, diagnosis: dict | None = None) -> Trace:
    """A trace whose speculative arm follows vanilla until ``fork`` and then differs at every position.

    Rounds are laid out like the real loop: round 0 is the prefill token, then
    each round emits ``accepted`` draft tokens and one target token, so
    ``len(tokens) == n_accepted + n_rounds`` holds.
    """
    vt = [(3 * i) % len(WORDS) for i in range(n)]
    st = [t if fork is None or i < fork else (t + 7) % len(WORDS) for i, t in enumerate(vt)]
    vsteps = [_step(i, t, margin=0.01 + (i % 7) * 0.9) for i, t in enumerate(vt)]
    ssteps: list[Step] = []
    rounds = [Round(index=0, drafted=0, accepted=0, draft_ms=0.0, verify_ms=1.0, batch_size=12, first_step=0)]
    ssteps.append(_step(0, st[0], margin=vsteps[0].margin, batch=12, row=11))
    r = 1
    pattern = [2, 0, 3, 1]
    while len(ssteps) < n:
        acc = min(pattern[r % len(pattern)], n - len(ssteps) - 1)
        first = len(ssteps)
        T = 1 + n_max
        for j in range(acc + 1):
            i = len(ssteps)
            ssteps.append(_step(i, st[i], margin=vsteps[i].margin * 0.97, round_=r, from_draft=j < acc,
                                batch=T, row=j))
        rounds.append(Round(index=r, drafted=n_max, accepted=acc, draft_ms=0.5, verify_ms=1.5, batch_size=T,
                            first_step=first, draft_tokens=[st[first + j] for j in range(acc)] + [0] * (n_max - acc)))
        r += 1
    v = ArmResult(name="vanilla", tokens=vt, steps=vsteps, text="".join(s.piece for s in vsteps),
                  gen_ms=400.0, stop_reason="max_tokens")
    s = ArmResult(name="speculative", tokens=st, steps=ssteps, rounds=rounds, text="".join(x.piece for x in ssteps),
                  gen_ms=250.0, stop_reason="max_tokens", drafter="draft-simple")
    return Trace(
        config={"target": "demo:Q8_0", "draft": "demo:Q4_0", "spec_type": "draft-simple", "n_max": n_max,
                "n_min": 0, "p_min": 0.0, "max_tokens": n, "chat": True, "ignore_eos": False,
                "engine": {"n_ctx": 0, "flash_attn": "auto", "gpu_layers": -1, "threads": 0}},
        environment={"specview": "test"},
        models={"target": {"file": "target.gguf"}, "draft": {"file": "draft.gguf"}},
        prompt={"text": "Tell me about the cat.", "chat": True, "tokens": [1, 2, 3]},
        vanilla=v,
        speculative=s,
        comparison=compare_arms(v, s),
        diagnosis=diagnosis,
    )
