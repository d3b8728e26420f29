"""The kernel map on real llama.cpp engines, checked against a computation that never rolls back a context."""

from __future__ import annotations

import door
import numpy as np
import pytest

from specview.core.config import EngineSettings
from specview.core.kernels.map import KernelMap, block_starts, kernel_map, tokens_needed
from specview.core.session import Session


def direct_rows(model, settings: EngineSettings, prompt: list[int], width: int, positions: int):
    """(single row, width-``width`` row) per measured position, every prefix built from scratch in a fresh context."""
    n_tok = tokens_needed([width], positions)
    n_ctx = ((len(prompt) + n_tok + 1 + 255) // 256) * 256

    def fresh_prefill():
        eng = model.new_engine(settings, n_ctx)
        row = None
        for start in range(0, len(prompt), settings.n_batch):
            row = eng.eval(prompt[start:start + settings.n_batch], rows=[-1])[0]
        return eng, row

    eng, row = fresh_prefill()
    single, seq = [row], [int(np.argmax(row))]
    for j in range(1, n_tok):
        single.append(eng.eval([seq[j - 1]], rows=[0])[0])
        seq.append(int(np.argmax(single[j])))
    eng.close()
    pairs = []
    for s in block_starts(width, positions):
        eng, _ = fresh_prefill()
        for t in seq[:s - 1]:
            eng.eval([t], rows=[0])
        out = eng.eval(seq[s - 1:s - 1 + width], rows=list(range(width)))
        eng.close()
        pairs += [(single[s + i], out[i]) for i in range(width)]
    return seq, pairs


def figures(pairs, k: int = 8):
    def top(row):
        return np.argsort(-row, kind="stable")[:k]

    same = [bool(np.array_equal(a.view(np.uint32), b.view(np.uint32))) for a, b in pairs]
    deltas = np.array([0.0 if s else float(np.max(np.abs(a[np.union1d(top(a), top(b))].astype(np.float64)
                                                          - b[np.union1d(top(a), top(b))])))
                       for s, (a, b) in zip(same, pairs)])
    flips = sum(int(np.argmax(a)) != int(np.argmax(b)) for a, b in pairs)
    margins = [float(np.diff(np.sort(a)[-2:])[0]) for a, _ in pairs]
    return {"rows": len(pairs), "identical": sum(same), "flips": flips, "max": float(deltas.max()),
            "p95": float(np.percentile(deltas, 95)), "below": sum(m < deltas.max() for m in margins)}


def check_width(session: Session, target: str, prompts: list[str], width: int, positions: int,
                settings: EngineSettings) -> KernelMap:
    settings = door.settings(settings, target=target)  # decided once: the map and the direct rows run the same
    km = kernel_map(session, [target], prompts, widths=[width], positions=positions, settings=settings)
    t = km.targets[0]
    st = t.widths[width]
    model = session.model("llama.cpp", target, settings)
    pairs = []
    for p, seqrec in zip(prompts, t.prompts):
        toks = model.tokenize(p, chat=True)
        assert seqrec.prompt_tokens == toks
        seq, ps = direct_rows(model, settings, toks, width, positions)
        assert seqrec.tokens == seq  # the same greedy sequence, computed without any rollback
        pairs += ps
    want = figures(pairs)
    assert (st.rows, st.identical, st.flips, st.below_shift) == (want["rows"], want["identical"], want["flips"],
                                                                 want["below"])
    assert st.max_delta == pytest.approx(want["max"], abs=1e-6)
    assert st.p95_delta == pytest.approx(want["p95"], abs=1e-6)
    assert t.deterministic  # the width-1 control: a rolled-back single-token pass gives the same bits
    return km


@pytest.mark.parametrize("width", [3, 5])
def test_tiny_model_width_matches_direct_computation(tiny_target, width):
    with Session() as s:
        check_width(s, str(tiny_target), ["the cat is on the", "a dog and a bicycle"], width, 9,
                    EngineSettings(threads=1))


def test_demo_width_matches_direct_computation(demo_paths):
    with Session() as s:
        km = check_width(s, str(demo_paths["Q8_0"]), ["Write an essay on the importance of sleep for students."],
                         4, 8, EngineSettings(threads=1))
    assert km.targets[0].model.get("quantization") == "Q8_0"
