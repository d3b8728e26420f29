"""Facts about speculative decoding on the real demo model (SmolLM2-135M-Instruct) at several quantizations."""

import ctypes

import door
import numpy as np
import pytest

from specview.backends.llama_cpp import default_threads
from specview.backends.llama_cpp import demo
from forks import find_fork
from specview.core.session import RunConfig, Session

pytestmark = pytest.mark.demo

ESSAY = "Write a short essay about the history of the bicycle."


@pytest.fixture(scope="module")
def session():
    s = Session()
    yield s
    s.close()


def cfg(demo_paths, target="Q8_0", **kw):
    base = dict(target=str(demo_paths[target]), draft=str(demo_paths["Q4_0"]), prompt=ESSAY, chat=True,
                max_tokens=128, ignore_eos=True, n_max=3)
    base.update(kw)
    return RunConfig(**base)


def test_serial_verify_reproduces_vanilla_on_an_f16_target(session, demo_paths):
    # whether the batched verify forks from vanilla depends on this CPU's kernels; computing each verify row
    # as its own single-token pass must reproduce vanilla exactly on any deterministic build
    t = session.run(cfg(demo_paths, "F16", serial_verify=True))
    assert t.speculative.n_accepted > 20  # it really speculated
    assert all(r.serial for r in t.speculative.rounds[1:])
    assert t.comparison.identical, t.comparison.first_mismatch
    assert len(t.vanilla.tokens) == 128


def test_p_min_one_drafts_nothing_and_is_identical(session, demo_paths):
    t = session.run(cfg(demo_paths, "Q4_K_M", p_min=1.0))
    assert t.speculative.n_drafted == 0
    assert all(r.batch_size == 1 for r in t.speculative.rounds[1:])
    assert t.comparison.identical


def test_vanilla_run_twice_is_identical(session, demo_paths):
    c = cfg(demo_paths, "Q8_0")
    a = session.run(c)
    b = session.run(c, reuse_vanilla=False)
    assert a.vanilla.tokens == b.vanilla.tokens
    assert [s.top_logits for s in a.vanilla.steps] == [s.top_logits for s in b.vanilla.steps]


def test_counts_add_up(session, demo_paths):
    t = session.run(cfg(demo_paths, "Q4_K_M", n_max=5))
    s = t.speculative
    assert len(s.tokens) == s.n_accepted + len(s.rounds)
    assert sum(st.from_draft for st in s.steps) == s.n_accepted
    assert all(r.batch_size == r.drafted + 1 for r in s.rounds[1:])
    assert sum(r.drafted for r in s.rounds) == s.n_drafted >= s.n_accepted > 0


def test_a_natural_fork_comes_after_a_batched_verify(session):
    # where (and whether) a quantized target forks depends on this CPU: find one over a fixed set of
    # configurations, and assert what holds for any natural fork
    t = find_fork(session).trace
    i = t.comparison.first_mismatch.index
    assert t.vanilla.tokens[:i] == t.speculative.tokens[:i]
    assert t.vanilla.tokens[i] != t.speculative.tokens[i]
    # had every pass up to the fork been single-token, the speculative arm would have computed exactly what
    # vanilla computed: some verify pass up to and including the fork's carried drafted tokens
    assert any(r.batch_size > 1 for r in t.speculative.rounds[1:] if r.first_step <= i)
    assert len(t.speculative.tokens) == t.speculative.n_accepted + len(t.speculative.rounds)


class PlainLlama:
    """A context written directly against llama-cpp-python's C API, for the reference loop below; its weights load
    as a run here loads them (``door.c_load``: no repack where the machine decides none)."""

    def __init__(self, path, n_ctx=512, n_batch=512):
        import llama_cpp as ll

        self.ll = ll
        self.model = door.c_load(ll, path)
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = default_threads()  # the thread count can move the logits
        self.ctx = door.c_context(ll, self.model, cp)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.n_batch = n_batch
        self.toks = []

    def feed(self, toks, all_rows=False):
        """Append tokens in one pass; return logits of the last row, or of every row."""
        ll, b, pos = self.ll, self.batch, len(self.toks)
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_rows or i == len(toks) - 1
        b.n_tokens = len(toks)
        assert ll.llama_decode(self.ctx, b) == 0
        self.toks += list(toks)
        rows = range(len(toks)) if all_rows else [len(toks) - 1]
        out = []
        for r in rows:
            p = ctypes.cast(ll.llama_get_logits_ith(self.ctx, r), ctypes.POINTER(ctypes.c_float))
            out.append(np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy())
        return out if all_rows else out[0]

    def keep(self, n):
        self.ll.llama_memory_seq_rm(self.ll.llama_get_memory(self.ctx), 0, n, -1)
        del self.toks[n:]

    def close(self):
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def reference_speculative(target_path, draft_path, prompt, n_tokens, n_max):
    """A plain draft-then-verify loop, written independently of specview's."""
    tgt, dft = PlainLlama(target_path), PlainLlama(draft_path)
    out = []
    row = None
    for i in range(0, len(prompt), tgt.n_batch):
        row = tgt.feed(prompt[i:i + tgt.n_batch])
    out.append(int(np.argmax(row)))
    while len(out) < n_tokens:
        seq = list(prompt) + out  # what the draft should have seen, the newest token last
        common = 0
        while common < min(len(dft.toks), len(seq) - 1) and dft.toks[common] == seq[common]:
            common += 1
        dft.keep(common)
        drow = dft.feed(seq[common:])
        drafts = []
        budget = min(n_max, n_tokens - len(out) - 1)
        while len(drafts) < budget:
            drafts.append(int(np.argmax(drow)))  # p_min = 0: always take the draft's top token
            if len(drafts) < budget:
                drow = dft.feed([drafts[-1]])
        rows = tgt.feed([out[-1]] + drafts, all_rows=True)
        n_acc = 0
        while n_acc < len(drafts) and int(np.argmax(rows[n_acc])) == drafts[n_acc]:
            n_acc += 1
        tgt.keep(len(prompt) + len(out) + n_acc)
        out += drafts[:n_acc] + [int(np.argmax(rows[n_acc]))]
    tgt.close()
    dft.close()
    return out


def test_speculative_arm_equals_a_separately_written_loop(session, demo_paths):
    c = cfg(demo_paths, "Q8_0", max_tokens=96, n_max=3)
    t = session.run(c)
    ref = reference_speculative(demo_paths["Q8_0"], demo_paths["Q4_0"], t.prompt["tokens"], 96, 3)
    assert t.speculative.tokens == ref


def test_demo_names_resolve_to_derived_files():
    p = demo.resolve("demo:Q8_0")
    assert p.exists() and p.name == "SmolLM2-135M-Instruct.Q8_0.gguf"
    assert demo.resolve("demo:Q4_1") == demo.shipped_path()
    rows = {r["name"]: r for r in demo.available()}
    assert rows["demo:Q8_0"]["status"] == "cached" and rows["demo:Q4_1"]["status"] == "shipped"


def test_a_trace_records_where_its_weights_were_held(session, demo_paths):
    """Each model's ``weight_buffers``: the weights' buffers as llama.cpp's load logged them. The plain ones hold the
    whole file's tensors (the file less its header and vocabulary), a repacked one (CPU_REPACK, AMX) appears only
    where the run did not decide against repacking, and the Q4_0 drafter's match a load through the door."""
    from specview.backends.llama_cpp.plant import REPACKED_BUFFERS

    t = session.run(cfg(demo_paths, "Q4_K_M", max_tokens=4))
    no_repack = t.config["engine"]["no_repack"]
    for role, quant in (("target", "Q4_K_M"), ("draft", "Q4_0")):
        buffers = t.models[role]["weight_buffers"]
        plain = sum(mib for name, mib in buffers.items() if name not in REPACKED_BUFFERS)
        mib = demo_paths[quant].stat().st_size / 2 ** 20
        assert 0.9 * mib < plain < mib, (role, buffers, mib)
        if no_repack:
            assert not set(buffers) & set(REPACKED_BUFFERS), (role, buffers)
    m = door.model(demo_paths["Q4_0"], gpu_layers=0)
    try:
        assert t.models["draft"]["weight_buffers"] == {k: round(v, 2) for k, v in m.weight_buffers.items()}
    finally:
        m.close()
