"""specview locate on real llama.cpp engines: the observer against NumPy, observing changes nothing, the demo."""

from __future__ import annotations

import dataclasses

import door
import numpy as np
import pytest

from specview.core.config import EngineSettings
from specview.core.locate.find import Located, compare_values, locate, token_axis
from specview.core.session import Session

# one thread: the threadpool's spin-waits make two-thread passes crawl on a busy machine; FA off names kq-*
TINY = door.settings(threads=1, flash_attn="off", kv_type="f32")
PROMPT = [1, 300, 301, 302, 303, 304]


# -- an independent forward pass of the tiny llama GGUF ------------------------------------------
def gguf_weights(path) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    import gguf

    r = gguf.GGUFReader(str(path))
    w = {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
         for t in r.tensors}

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    hp = {"n_head": int(field("llama.attention.head_count")), "n_head_kv": int(field("llama.attention.head_count_kv")),
          "eps": float(field("llama.attention.layer_norm_rms_epsilon")), "base": float(field("llama.rope.freq_base")),
          "n_layer": int(field("llama.block_count"))}
    return w, hp


def rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x, pos, base):
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: adjacent pairs (x[2i], x[2i+1]) rotated by pos * base^(-2i/d)."""
    d = x.shape[-1]
    theta = pos[:, None] * base ** (-np.arange(0, d, 2) / d)  # (T, d/2)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def numpy_forward(w, hp, tokens, pos0, kv):
    """Named node values of one pass over ``tokens`` at ``pos0...``, in llama.cpp's graph order; ``kv`` grows."""
    f64 = {k: v.astype(np.float64) for k, v in w.items()}
    nodes: list[tuple[str, str, np.ndarray]] = []
    T = len(tokens)
    pos = np.arange(pos0, pos0 + T, dtype=np.float64)
    x = f64["token_embd.weight"][tokens]
    nodes.append(("embd", "GET_ROWS", x))
    nh, nkv = hp["n_head"], hp["n_head_kv"]
    for il in range(hp["n_layer"]):
        p = f"blk.{il}."
        h = rms(x, hp["eps"])
        nodes.append((f"norm-{il}", "RMS_NORM", h))
        h = h * f64[p + "attn_norm.weight"]
        nodes.append((f"attn_norm-{il}", "MUL", h))
        q = h @ f64[p + "attn_q.weight"].T
        nodes.append((f"Qcur-{il}", "MUL_MAT", q))
        hd = q.shape[-1] // nh
        q = rope(q.reshape(T, nh, hd), pos, hp["base"])
        nodes.append((f"Qcur-{il}", "ROPE", q))
        v = (h @ f64[p + "attn_v.weight"].T).reshape(T, nkv, hd)
        nodes.append((f"Vcur-{il}", "MUL_MAT", v.reshape(T, -1)))  # llama.cpp computes V before K
        k = h @ f64[p + "attn_k.weight"].T
        nodes.append((f"Kcur-{il}", "MUL_MAT", k))
        k = rope(k.reshape(T, nkv, hd), pos, hp["base"])
        nodes.append((f"Kcur-{il}", "ROPE", k))
        ks, vs = kv.setdefault(il, ([], []))
        ks.extend(k)
        vs.extend(v)
        K, V = np.stack(ks), np.stack(vs)  # (n_past + T, nkv, hd)
        n = K.shape[0]
        kq = np.einsum("thd,nhd->thn", q, np.repeat(K, nh // nkv, axis=1))  # (T, nh, n)
        nodes.append((f"kq-{il}", "MUL_MAT", kq))
        mask = np.arange(n)[None, :] > (pos0 + np.arange(T))[:, None]  # causal
        z = kq / np.sqrt(hd) + np.where(mask, -np.inf, 0.0)[:, None, :]
        sm = np.exp(z - z.max(-1, keepdims=True))
        sm /= sm.sum(-1, keepdims=True)
        nodes.append((f"kq_soft_max-{il}", "SOFT_MAX", sm))
        o = np.einsum("thn,nhd->thd", sm, np.repeat(V, nh // nkv, axis=1)).reshape(T, -1)
        nodes.append((f"kqv_out-{il}", "CONT", o))
        a = o @ f64[p + "attn_output.weight"].T
        nodes.append((f"attn_out-{il}", "MUL_MAT", a))
        x = a + x
        nodes.append((f"ffn_inp-{il}", "ADD", x))
        h = rms(x, hp["eps"])
        nodes.append((f"norm-{il}", "RMS_NORM", h))
        h = h * f64[p + "ffn_norm.weight"]
        nodes.append((f"ffn_norm-{il}", "MUL", h))
        g = h @ f64[p + "ffn_gate.weight"].T
        u = h @ f64[p + "ffn_up.weight"].T
        nodes.append((f"ffn_gate-{il}", "MUL_MAT", g))
        nodes.append((f"ffn_up-{il}", "MUL_MAT", u))
        s = g / (1 + np.exp(-g)) * u
        nodes.append((f"ffn_swiglu-{il}", "GLU", s))
        d = s @ f64[p + "ffn_down.weight"].T
        nodes.append((f"ffn_out-{il}", "MUL_MAT", d))
        x = d + x
        nodes.append((f"l_out-{il}", "ADD", x))
    h = rms(x, hp["eps"])
    nodes.append(("norm", "RMS_NORM", h))
    h = h * f64["output_norm.weight"]
    nodes.append(("result_norm", "MUL", h))
    nodes.append(("result_output", "MUL_MAT", h @ f64["output.weight"].T))
    return nodes


def as_numpy_order(ref: np.ndarray, name: str, n_valid: int) -> np.ndarray:
    """A NumPy-pass value in the layout ggml holds the node in (NumPy order: ne reversed), one token."""
    if name.startswith(("kq-", "kq_soft_max-")):  # ggml [n_kv, n_tokens, n_head] -> (n_head, n_tokens, n_kv)
        return np.transpose(ref, (1, 0, 2))[..., :n_valid]
    return ref


def check_pass(captured, ref, row: int, width: int, n_valid: int):
    """Every NumPy node, in order, equals the next captured node of that name and op (row ``row``)."""
    i = 0
    matched = []
    for name, op, value in ref:
        while i < len(captured) and not (captured[i].name == name and (captured[i].op == op or
                                                                        (op == "GLU" and captured[i].op == "SWIGLU"))):
            i += 1
        assert i < len(captured), f"{name} {op} is not in the captured graph after node {matched[-1:] or 'start'}"
        node = captured[i]
        got = node.values.reshape(tuple(reversed(node.ne)))
        if width > 1:  # the tiny model has no other axis of this size: the token axis is the one that matches
            axes = [d for d in range(4) if node.ne[d] == width]
            assert len(axes) == 1, (name, node.ne)
            got = np.take(got, [row], axis=3 - axes[0])
        want = as_numpy_order(value[row:row + 1], name, n_valid)
        if name.startswith(("kq-", "kq_soft_max-")):
            got = got[..., :n_valid]
        np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=2e-4, atol=2e-5, err_msg=f"{name} {op}")
        matched.append(name)
        i += 1
    return matched


@pytest.fixture(scope="module")
def tiny(tiny_target):
    model = door.model(tiny_target)
    yield model
    model.close()


@pytest.mark.parametrize("width,row", [(1, 0), (3, 2)])
def test_captured_nodes_equal_a_numpy_forward_pass(tiny, tiny_target, width, row):
    w, hp = gguf_weights(tiny_target)
    eng = door.context(tiny, TINY, n_ctx=256, observed=True)
    try:
        eng.eval(PROMPT, rows=[-1])
        kv: dict = {}
        numpy_forward(w, hp, PROMPT, 0, kv)
        toks = [310, 311, 312][:width]
        _, (mb,) = eng.observe(toks, rows=range(width))
        ref = numpy_forward(w, hp, toks, len(PROMPT), kv)
    finally:
        eng.close()
    names = check_pass(mb.nodes, ref, row, width, len(PROMPT) + row + 1)
    assert names[0] == "embd" and names[-1] == "result_output"
    assert len(names) == len(ref) == 4 + hp["n_layer"] * 19
    # the graph's order is llama.cpp's: the NumPy pass names a subsequence of it, in the same order
    order = [n.name for n in mb.nodes]
    assert order.index("embd") < order.index("Qcur-0") < order.index("l_out-0") < order.index("result_output")


def test_the_token_axis_of_kq_is_not_the_outermost(tiny):
    eng = door.context(tiny, TINY, n_ctx=256, observed=True)
    try:
        eng.eval(PROMPT, rows=[-1])
        _, (mb,) = eng.observe([310, 311, 312, 313], rows=range(4))
    finally:
        eng.close()
    kq = next(n for n in mb.nodes if n.name == "kq-0")
    assert kq.ne[1] == 4 and kq.ne[0] == 256 and kq.ne[2] == 4  # [n_kv, n_tokens, n_head]
    assert token_axis((256, 1, 4, 1), kq.ne, 4) == 1


def plain_and_observed(model, settings, prompt, feed, width, selection="all"):
    plain = door.context(model, settings, n_ctx=512)
    obs = door.context(model, settings, n_ctx=512, observed=True, selection=selection)
    try:
        for e in (plain, obs):
            e.eval(prompt, rows=[-1])
            for t in feed[:-width]:
                e.eval([t], rows=[0])
        a = plain.eval(feed[-width:], rows=range(width))
        b, micro = obs.observe(feed[-width:], rows=range(width))
    finally:
        plain.close()
        obs.close()
    return a, b, micro


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8])
def test_observing_the_tiny_model_changes_no_logit(tiny, width):
    a, b, micro = plain_and_observed(tiny, TINY, PROMPT, [310, 311, 312, 313, 314, 315, 316, 317, 318], width)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert sum(m.width for m in micro) == width and len(micro[0].nodes) > 40


def test_the_kv_copy_is_exact(tiny):
    """The observed context gets the walk's KV prefix by copy: its next pass equals the walk's, bit for bit."""
    a = door.context(tiny, TINY, n_ctx=256)
    b = door.context(tiny, TINY, n_ctx=256, observed=True)
    try:
        a.eval(PROMPT, rows=[-1])
        for t in (310, 311):
            a.eval([t], rows=[0])
        b.eval([5, 6, 7, 8, 9, 10, 11, 12], rows=[-1])  # other contents, to be replaced
        b.take_state(a)
        assert b.n_past == a.n_past
        x, y = a.eval([312, 313], rows=[0, 1]), b.eval([312, 313], rows=[0, 1])
    finally:
        a.close()
        b.close()
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


# -- the demo ------------------------------------------------------------------------------------
DEMO = EngineSettings(threads=1)


@pytest.fixture(scope="module")
def session():
    s = Session()
    yield s
    s.close()


@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_observing_the_demo_changes_no_logit(demo_paths, quant):
    model = door.model(demo_paths[quant])
    try:
        prompt = model.tokenize("The history of the bicycle", chat=False)
        for width in (1, 2, 4, 8):
            a, b, _ = plain_and_observed(model, door.settings(DEMO), prompt, [42] * 9, width)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), width
    finally:
        model.close()


def _found_difference(session) -> Located:
    """The first configuration of a small fixed set whose batched pass differs somewhere (which one forks is
    the CPU's business)."""
    for quant, width in (("F16", 2), ("F16", 4), ("Q8_0", 4), ("Q4_K_M", 8), ("Q4_0", 8)):
        loc = locate(session, f"demo:{quant}", width=width, row=0, position=12, prompt="Write an essay on sleep.",
                     settings=DEMO)
        if not loc.identical:
            return loc
    pytest.fail("no demo quantization differed at widths 2-8: every CPU seen so far differs somewhere")


def test_the_first_differing_node_is_named_with_its_op_types_and_buffer(session):
    loc = _found_difference(session)
    assert loc.observer_exact
    first = loc.first
    assert first is not None and first.op and first.type and first.buffer
    assert first.sources and all(s.type and s.shape for s in first.sources)
    # everything compared before it is bit-identical; the differences it starts reach no node before it
    before = [d for d in loc.nodes if d.index < first.index]
    assert all(d.status in ("identical", "skipped") for d in before)
    assert first.n_diff > 0 and first.max_abs > 0 and first.n_diff <= first.n_elems
    if first.weight is not None:
        assert first.weight.buffer and first.weight.type
    # a logit that differs went through result_output: that node differs too
    out = next(d for d in loc.nodes if d.name == "result_output")
    assert (loc.logits.n_diff > 0) == (out.status == "differs")
    assert out.n_diff == loc.logits.n_diff
    # JSON round trip keeps what the text says
    back = Located.from_json(loc.to_json())
    assert back.where() == loc.where() and back.text() == loc.text()


def test_with_ub_1_nothing_differs(session):
    loc = _found_difference(session)
    ub1 = locate(session, loc.target, width=loc.width, row=loc.width - 1, position=12,
                 prompt="Write an essay on sleep.", settings=dataclasses.replace(DEMO, n_ubatch=1))
    assert ub1.identical and ub1.first is None and ub1.count("identical") > 100
    assert any("micro-batches" in n for n in ub1.notes)


def test_a_width_the_kernel_map_calls_bit_identical_has_identical_logits(session):
    """Width 1 is the map's control; any other width it calls bit-identical must give identical logits here."""
    from specview.core.kernels.map import kernel_map

    km = kernel_map(session, ["demo:Q4_K_M"], ["essay"], widths=[1, 2, 3], positions=4, settings=DEMO)
    t = km.targets[0]
    seq = t.prompts[0]
    for w in t.safe_widths():
        loc = locate(session, "demo:Q4_K_M", width=w, row=0, position=1, prompt_tokens=seq.prompt_tokens,
                     settings=DEMO)
        assert loc.logits.n_diff == 0, w
        if w == 1:
            assert loc.identical
    assert 1 in t.safe_widths()


def test_without_repack_no_weight_is_in_a_repacked_buffer(session):
    loc = locate(session, "demo:Q4_K_M", width=8, row=0, position=12, prompt="Write an essay on sleep.",
                 settings=dataclasses.replace(DEMO, no_repack=True))
    bufs = {s.buffer for d in loc.nodes for s in d.sources if s.weight}
    assert bufs and not any("REPACK" in (b or "") or b == "AMX" for b in bufs)
    if loc.first is not None and loc.first.weight is not None:
        assert "REPACK" not in (loc.first.weight.buffer or "")


def test_locate_and_compare_agree_on_the_logits(session):
    """The logits count is the plain passes' own: recomputed here from scratch it is the same."""
    loc = locate(session, "demo:F16", width=2, row=1, position=5, prompt="Write an essay on sleep.", settings=DEMO)
    model = door.model(loc.model["path"])
    try:
        eng = door.context(model, door.settings(DEMO), n_ctx=512)
        ids = model.tokenize("Write an essay on sleep.", chat=True)
        row = eng.eval(ids, rows=[-1])[0]
        seq = []
        for _ in range(5):
            seq.append(int(np.argmax(row)))
            row = eng.eval([seq[-1]], rows=[0])[0]
        single = row  # the row of token 5: fed token 4 on the single-token prefix
        eng.truncate(len(ids) + 3)
        batched = eng.eval([seq[3], seq[4]], rows=[0, 1])[1]
        eng.close()
    finally:
        model.close()
    assert loc.single_tokens == [seq[4]] and loc.batch_tokens == [seq[3], seq[4]]
    assert compare_values(single, batched)[0] == loc.logits.n_diff


# -- the command ---------------------------------------------------------------------------------
def test_the_command_writes_shows_and_refuses_what_it_cannot_observe(tiny_target, tmp_path, capsys):
    from specview.cli import main

    out = tmp_path / "loc.json"
    rc = main(["locate", "-m", str(tiny_target), "--width", "3", "--row", "1", "--position", "4", "--tokens",
               "1,300,301", "-t", "1", "-fa", "off", "--json", str(out), "-q"])
    printed = capsys.readouterr().out
    loc = Located.load(out)
    assert rc == (0 if loc.identical else 1)
    assert (loc.width, loc.row, loc.position, loc.settings.flash_attn) == (3, 1, 4, "off")
    assert loc.observer_exact and loc.count("identical") + loc.count("differs") > 40
    assert main(["locate", "--show", str(out)]) == rc
    assert capsys.readouterr().out == printed
    assert main(["locate", "-m", str(tiny_target), "--width", "2", "--engine", "llama-server"]) == 2
    assert "not observable" in capsys.readouterr().err
    assert main(["locate", "-m", str(tiny_target), "--width", "2", "--row", "2", "--tokens", "1,300"]) == 2
    assert "--row" in capsys.readouterr().err


def test_a_trace_locates_its_own_fork(session):
    from specview.core.locate.find import fork_of
    from specview.core.registry import Runner
    from forks import find_fork

    fork = find_fork(session, threads=1)
    trace = fork.trace
    req = fork_of(trace)
    k = trace.comparison.first_mismatch.index
    step = trace.speculative.steps[k]
    assert (req["position"], req["width"], req["row"]) == (k, step.batch_size, step.batch_index)
    # the trace's settings as they ran: what the run's config left unset, decided for this machine
    assert req["settings"] == Runner.resolve(fork.cfg).config.engine and req["target"] == fork.cfg.target
    loc = locate(session, **req)
    assert loc.source == "trace" and loc.observer_exact
    assert loc.single_tokens == [trace.vanilla.tokens[k - 1]]
    start = k - loc.row
    assert loc.batch_tokens[:loc.row + 1] == trace.vanilla.tokens[start - 1:k]
    assert not any("replay's greedy token" in n for n in loc.notes)  # the walk reproduced the trace's vanilla arm
    if loc.width > 1 and not loc.identical:
        assert loc.first.op and loc.first.sources
    # a near-tie diagnosis of the same fork says where its verify pass first departs, in its words too
    d = session.diagnose(trace, fork.cfg)
    if d["verdict"] == "near-tie":
        dep = d["departure"]
        assert (dep["width"], dep["row"], dep["position"]) == (loc.width, loc.row, loc.position)
        assert dep["node"] == (loc.first.name if loc.first else None) and dep["where"] == loc.where()
        assert "Located on the same single-token prefix" in d["explanation"]
