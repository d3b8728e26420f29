"""``specview locate`` on MLX: the passes compared layer by layer, on tiny random-weight models built here.

The captured layer outputs are checked against the model's own modules called
one by one in the test (no specview code in between), and a difference planted
in one transformer block of the batched pass, in a real worker process
(``tests/plants_mlx.py``), is located at that block.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from require import require_module

mx = require_module("mlx.core")
require_module("mlx_lm")

from mlx_lm.models.base import create_attention_mask  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from plants_mlx import NAME, PATH  # noqa: E402

from specview.backends.mlx import MLXEngine, MLXModel, write_random_model  # noqa: E402
from specview.backends.mlx.layers import PER_LAYER_NOTE, LayerEngine  # noqa: E402
from specview.core.config import EngineSettings  # noqa: E402
from specview.core.locate.find import Located, locate  # noqa: E402
from specview.core.registry import get_backend, register_backend, unregister_backend  # noqa: E402
from specview.core.worker import WorkerRunner  # noqa: E402

PROMPT = "the quick brown fox"
N_LAYERS = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("mlx-locate") / "tiny", seed=5, num_layers=N_LAYERS)


@pytest.fixture(scope="module")
def model(folder):
    return MLXModel(folder)


@pytest.fixture
def planted():
    register_backend(NAME, PATH)
    yield
    unregister_backend(NAME)


def by_hand(model: MLXModel, prompt: list[int], token: int) -> list[np.ndarray]:
    """The single-token pass after ``prompt``, through the model's own modules one by one, on a fresh cache."""
    m = model.model
    inner = m.model
    cache = make_prompt_cache(m)
    mx.eval(m(mx.array(prompt, dtype=mx.uint32)[None], cache=cache))
    h = inner.embed_tokens(mx.array([[token]], dtype=mx.uint32))
    outs = [h]
    mask = create_attention_mask(h, cache[0])
    for layer, c in zip(inner.layers, cache):
        h = layer(h, mask, cache=c)
        outs.append(h)
    h = inner.norm(h)
    outs.append(h)
    outs.append(m.lm_head(h))
    mx.eval(*outs)
    return [np.array(o.astype(mx.float32)).reshape(-1) for o in outs]


def test_the_layer_values_of_a_single_token_pass_are_the_models_own(model):
    prompt = model.tokenize(PROMPT)
    plain = MLXEngine(model, EngineSettings(), n_ctx=256)
    obs = LayerEngine(model, EngineSettings(), n_ctx=256)
    try:
        plain.eval(prompt, rows=[len(prompt) - 1])
        obs.take_state(plain)
        token = 7
        logits, (mb,) = obs.observe([token], [0])
        ref = plain.eval([token], rows=[0])
    finally:
        obs.close()
        plain.close()
    assert [n.name for n in mb.nodes] == ["embd"] + [f"blk.{i}" for i in range(N_LAYERS)] + ["norm", "logits"]
    assert [n.op for n in mb.nodes] == ["embedding"] + ["layer"] * N_LAYERS + ["norm", "head"]
    assert mb.width == 1 and all(n.ne[1] == 1 for n in mb.nodes)
    hand = by_hand(model, prompt, token)
    for node, want in zip(mb.nodes, hand):
        np.testing.assert_allclose(node.values.reshape(-1), want, rtol=1e-5, atol=1e-5, err_msg=node.name)
    # the observed pass's logits are the unobserved engine's, bit for bit, and its last node
    assert np.array_equal(logits.view(np.uint32), ref.view(np.uint32))
    assert np.array_equal(mb.nodes[-1].values.reshape(-1).view(np.uint32), ref[0].view(np.uint32))
    # what can be said of the weights: their dtype (this model is float32), and where they were computed
    blk = mb.nodes[1]
    assert blk.sources[0].name == "embd" and not blk.sources[0].weight
    w = next(s for s in blk.sources if s.weight)
    assert w.type == "float32" and w.buffer in ("MLX cpu", "MLX gpu")
    # the taps are gone: the model's own call runs its own modules again
    assert all(type(layer).__name__ == "TransformerBlock" for layer in model.model.model.layers)


def test_taking_the_state_copies_it(model):
    prompt = model.tokenize(PROMPT)
    plain = MLXEngine(model, EngineSettings(), n_ctx=256)
    obs = LayerEngine(model, EngineSettings(), n_ctx=256)
    try:
        plain.eval(prompt, rows=[len(prompt) - 1])
        obs.take_state(plain)
        before = plain.eval([9], rows=[0])
        plain.truncate(len(prompt))
        obs.observe([11, 12, 13], [0, 1, 2])  # writes into the copy only
        again = plain.eval([9], rows=[0])
    finally:
        obs.close()
        plain.close()
    assert np.array_equal(before.view(np.uint32), again.view(np.uint32))


def test_quantized_weights_are_named_by_bits_and_group(tmp_path):
    from specview.backends.mlx import derive_quantized

    src = write_random_model(tmp_path / "f32", seed=2)
    q = MLXModel(derive_quantized(src, 4, group_size=32, cache_dir=tmp_path / "cache"))
    obs = LayerEngine(q, EngineSettings(), n_ctx=64)
    try:
        _, (mb,) = obs.observe([1, 5], [0, 1])
    finally:
        obs.close()
    w = next(s for s in mb.nodes[1].sources if s.weight)
    assert "4-bit (group 32)" in w.type


def _locate(runner, folder, **kw):
    req = dict(target=str(folder), width=4, row=2, position=6, prompt=PROMPT, chat=False, backend=NAME)
    req.update(kw)
    return runner.job(locate, **req)


@pytest.mark.parametrize("layer", [0, 2])
def test_a_planted_batched_difference_is_located_at_its_layer(planted, folder, monkeypatch, layer):
    with get_backend(NAME).runner() as r:
        assert isinstance(r, WorkerRunner)
        clean = _locate(r, folder)
    monkeypatch.setenv("SPECVIEW_PLANT_MLX", f"{layer}:0.01")  # read by the worker when it loads the model
    with get_backend(NAME).runner() as r:
        assert isinstance(r, WorkerRunner) and r.pid != os.getpid()
        loc = _locate(r, folder)
    assert loc.observer_exact and loc.granularity == "layer" and loc.selection == "layers"
    # where the unplanted pass already departs earlier (a GPU's batched kernels), that comes first
    natural = clean.first.index if clean.first is not None else None
    planted_at = 1 + layer  # embd is node 0
    assert loc.first.index == (planted_at if natural is None else min(natural, planted_at))
    if natural is None:
        first = loc.first
        assert (first.name, first.op, first.layer, first.part) == (f"blk.{layer}", "layer", layer, f"blk.{layer}")
        assert first.max_abs == pytest.approx(0.01, rel=1e-3) and first.n_diff == first.n_elems
        assert all(d.status == "identical" for d in loc.nodes[:planted_at])
        assert all(d.status == "differs" for d in loc.nodes[planted_at:])
        assert loc.where().startswith(f"first differs at blk.{layer} (layer {layer} output) on float32 weights")
        assert "per layer, not per op" in loc.where()
    assert PER_LAYER_NOTE in loc.notes and "per layer, not per op" in loc.text()
    back = Located.from_json(loc.to_json())
    assert back.granularity == "layer" and back.where() == loc.where()


def test_no_planted_difference_is_no_difference(planted, folder):
    with get_backend(NAME).runner() as r:
        loc = _locate(r, folder)
    assert loc.observer_exact and loc.count("skipped") == 0
    assert [d.status for d in loc.nodes].count("identical") + loc.count("differs") == N_LAYERS + 3
    if mx.default_device() == mx.cpu:
        # MLX's CPU backend computes each row of this float32 model the same at any width
        assert loc.identical and "bit-identical" in loc.where()


def test_the_command_locates_an_mlx_folder(folder, capsys, tmp_path):
    from specview.cli import main

    out = tmp_path / "loc.json"
    rc = main(["locate", "--engine", "mlx", "-m", str(folder), "--width", "3", "--row", "1", "--position", "3",
               "--prompt", PROMPT, "--no-chat", "--json", str(out), "-q"])
    printed = capsys.readouterr().out
    loc = Located.load(out)
    assert rc == (0 if loc.identical else 1)
    assert loc.backend == "mlx" and loc.granularity == "layer" and (loc.width, loc.row) == (3, 1)
    assert "per layer, not per op" in printed
