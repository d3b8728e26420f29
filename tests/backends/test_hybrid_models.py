"""The tiny hybrid models the tests write (tests/tinyhybrid.py): llama.cpp loads each as its own architecture,
classifies its memory as hybrid, and cannot cut it with llama_memory_seq_rm, which is what the rollback tests
need; a seed fixes the bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import door  # noqa: E402
from tinyhybrid import PAIRS, WRITERS, hybrid_pair  # noqa: E402


@pytest.fixture(scope="module", params=sorted(WRITERS))
def pair(request, tmp_path_factory):
    arch = request.param
    return arch, *hybrid_pair(arch, tmp_path_factory.mktemp(arch))


def test_llama_cpp_loads_each_as_a_hybrid_of_its_own_architecture(pair):
    arch, target, draft = pair
    for path, quant in ((target, "F32"), (draft, "Q4_0")):
        m = door.model(path)
        try:
            facts = m.facts()
            assert facts["architecture"] == arch and facts["quantization"] == quant
            assert m._ll.llama_model_is_hybrid(m.ptr) and not m._ll.llama_model_is_recurrent(m.ptr)
            assert m.load_seconds < 1.0
        finally:
            m.close()


def test_its_memory_refuses_a_partial_seq_rm_and_drops_everything_at_zero(pair):
    arch, target, _ = pair
    m = door.model(target)
    e = door.context(m, door.settings(threads=1, target=target), n_ctx=128)
    try:
        e.eval(m.tokenize("the cat and the dog"), rows=[-1])
        ll = e._ll
        assert not ll.llama_memory_seq_rm(e.mem, 0, 3, -1)  # what the in-process engine used to stop at
        assert ll.llama_memory_seq_rm(e.mem, 0, 0, -1)
    finally:
        e.close()
        m.close()


def test_a_seed_fixes_the_bytes_and_another_seed_other_weights(tmp_path):
    for arch, write in WRITERS.items():
        a = write(tmp_path / f"{arch}-a.gguf", seed=3, **PAIRS[arch]).read_bytes()
        b = write(tmp_path / f"{arch}-b.gguf", seed=3, **PAIRS[arch]).read_bytes()
        c = write(tmp_path / f"{arch}-c.gguf", seed=4, **PAIRS[arch]).read_bytes()
        assert a == b and a != c
        assert len(a) == len(c)  # the same shapes: only the weights differ


def test_the_q4_0_drafter_agrees_with_its_target_often_but_not_always(pair):
    """Greedy next-token picks of target and drafter over one greedy walk of the target: some equal, some not,
    so a speculative run on the pair both accepts and rejects."""
    arch, target, draft = pair
    mt, md = door.model(target), door.model(draft)
    et = door.context(mt, door.settings(threads=1, target=target), n_ctx=256)
    ed = door.context(md, door.settings(threads=1, target=draft), n_ctx=256)
    try:
        toks = mt.tokenize("the cat and the dog")
        rt, rd = et.eval(toks, rows=[-1])[0], ed.eval(toks, rows=[-1])[0]
        same = 0
        n = 64
        for _ in range(n):
            t = int(np.argmax(rt))
            same += t == int(np.argmax(rd))
            rt, rd = et.eval([t], rows=[0])[0], ed.eval([t], rows=[0])[0]
        assert 0.1 * n < same < 0.95 * n, same
    finally:
        et.close()
        ed.close()
        mt.close()
        md.close()
