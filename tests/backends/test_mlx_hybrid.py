"""The MLX engine on hybrid models mlx-lm refuses to speculate on: tiny lfm2 and qwen3_5 written here.

Both keep an ``ArraysCache`` per recurrent layer (lfm2: a short convolution's
window; qwen3_5: a gated-delta-net's convolution window and recurrent state)
beside a KV cache per attention layer, and mlx-lm's own speculative loop
refuses them.  The engine rolls them back by checkpoint and restore
(specview/backends/mlx/rollback.py); these tests check the restores against
fresh contexts bit for bit, run both arms with a drafter that is accepted in
part (a 4-bit copy of the target), and plant faults in the restore that the
serial-verify control must call a state bug.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from require import require_module

mx = require_module("mlx.core")
require_module("mlx_lm")

from mlx_lm.generate import speculative_generate_step  # noqa: E402
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache  # noqa: E402
from mlx_lm.utils import load as mlx_load  # noqa: E402

from specview.backends.mlx import MLXEngine, MLXModel, derive_quantized, write_random_model  # noqa: E402
from specview.backends.mlx.backend import MLXLoaded  # noqa: E402
from specview.backends.mlx.rollback import KEEP, describe, is_snapshot, leaves  # noqa: E402
from specview.core.arms.drafters import ModelDrafter  # noqa: E402
from specview.core.arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy  # noqa: E402
from specview.core.session import RunConfig, Session  # noqa: E402
from specview.core.engine import EvalError  # noqa: E402

ARCHS = ("lfm2", "qwen3_5")
PROMPT_TEXT = "the quick brown fox"
N_MAX = 3
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlx-hybrid")
    out = {}
    for arch in ARCHS:
        target = write_random_model(root / arch, seed=1, arch=arch)
        # the drafter: the same weights at 4 bits, accepted in part
        out[arch] = (target, derive_quantized(target, 4, group_size=32, cache_dir=root / "cache"))
    out["llama"] = (write_random_model(root / "llama", seed=1), None)
    return out


@pytest.fixture(scope="module")
def models(folders):
    return {arch: (MLXModel(t), MLXModel(d) if d else None) for arch, (t, d) in folders.items()}


def _prompt(model: MLXModel) -> list[int]:
    return model.tokenize(PROMPT_TEXT)


# -- planted faults in the restore ------------------------------------------------------------
class SkipsRestore(MLXEngine):
    """Rolls back like a KV cache: trims what trims and leaves the recurrent state holding the rejected drafts."""

    def _restore(self, pos, cp):
        want = self.n_past - pos
        for c in leaves(self.cache):
            if not is_snapshot(c):
                c.trim(want)


class RestoresOneLate(MLXEngine):
    """Restores the recurrent state one token past its checkpoint (the checkpoint's first token already in it)."""

    def _restore(self, pos, cp):
        super()._restore(pos, cp)
        first = self._history.replay_plan(pos, pos + 1)
        if first:
            with mx.stream(self._stream()):
                mx.eval(self._forward(self._mxm, first[0], [0]), *self._states())
            for c in leaves(self.cache):
                if not is_snapshot(c):
                    c.trim(1)  # the KV entries end at the checkpoint again; the recurrent state does not


class StaleCheckpoint(MLXEngine):
    """Restores the checkpoint before the one it should (a snapshot index off by one), as if it were that one."""

    def _restore(self, pos, cp):
        cps = self._history.checkpoints
        i = next(i for i, c in enumerate(cps) if c is cp)
        super()._restore(pos, cps[i - 1] if i > 0 else cp)


class SkipsReplay(MLXEngine):
    """Restores the checkpoint, trims the KV entries to where it was asked, and feeds nothing again."""

    def _roll_back(self, n):
        from specview.backends.mlx.rollback import MLXRollback, put_back

        cp = self._history.at_or_before(n)
        put_back(self._history.entries, cp)
        for c in leaves(self.cache):
            if not is_snapshot(c):
                c.trim(self.n_past - n)
        return self._rolled_back(n, MLXRollback("checkpoint", 0, n_from=self.n_past, n_to=n, restored_at=cp.pos))


# -- what mlx-lm does, and what the trace says --------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_lm_refuses_speculation_and_the_facts_say_so(arch, folders, models):
    target, draft = folders[arch]
    tmodel, _ = mlx_load(str(target))
    dmodel, _ = mlx_load(str(draft))
    prompt = _prompt(models[arch][0])
    with pytest.raises(ValueError, match="Speculative decoding requires a trimmable prompt cache"):
        next(speculative_generate_step(mx.array(prompt, dtype=mx.uint32), tmodel, dmodel, num_draft_tokens=N_MAX))
    f = models[arch][0].facts()
    assert f["architecture"] == arch and f["rollback"] == "checkpoint"
    assert "mlx-lm itself refuses speculative decoding" in f["rollback_note"] and "ArraysCache" in f["rollback_note"]
    assert MLXEngine(models[arch][0], n_ctx=64).rollback_mode(1) == "checkpoint"
    llama = models["llama"][0]
    assert llama.facts()["rollback"] == "seq-rm" and "rollback_note" not in llama.facts()
    assert MLXEngine(llama, n_ctx=64).rollback_mode(1) == "seq-rm"


def test_a_cache_that_cannot_be_rolled_back_is_refused_naming_its_types(models):
    class LayerWindow:  # a cache class specview does not know, that cannot trim
        def is_trimmable(self):
            return False

    full = RotatingKVCache(max_size=4)
    full.offset = 8  # a sliding window that has wrapped: mlx-lm cannot trim it
    mode, note = describe([ArraysCache(1), KVCache(), LayerWindow(), full])
    assert mode == "none"
    assert "cannot roll back LayerWindow, RotatingKVCache entries" in note and "mlx-lm itself refuses" in note
    assert describe([ArraysCache(1), KVCache()])[0] == "checkpoint" and describe([KVCache()]) == ("seq-rm", None)

    eng = MLXEngine(models["lfm2"][0], n_ctx=64)
    prompt = _prompt(eng.model)
    eng.eval(prompt, rows=[-1])
    eng.prepare_rollback(2)
    eng.eval([5, 6], rows=[0, 1])
    eng.cache.append(LayerWindow())
    with pytest.raises(EvalError, match=r"\(LayerWindow\) cannot be rolled back"):
        eng.truncate(len(prompt))
    eng.truncate(0)  # a reset is always possible: a new cache
    assert eng.n_past == 0 and {type(c).__name__ for c in eng.cache} == {"ArraysCache", "KVCache"}


# -- the restore, bit for bit --------------------------------------------------------------------
def _fed(model, passes, then):
    """A fresh engine fed ``passes`` (each one pass), then ``then``'s logits."""
    eng = MLXEngine(model, n_ctx=64)
    for toks in passes:
        eng.eval(toks, rows=[-1])
    return eng.eval(then, rows=[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_truncate_restores_the_checkpoint_bit_for_bit(arch, models):
    model = models[arch][0]
    prompt = _prompt(model)
    n0 = len(prompt)
    a, b, c, d = 17, 42, 99, 7

    # the loop's rollback: back to exactly the checkpoint kept before the verify pass
    eng = MLXEngine(model, n_ctx=64)
    eng.eval(prompt, rows=[-1])
    assert eng.prepare_rollback(3) == "checkpoint"
    eng.eval([a, b, c], rows=range(3))
    rb = eng.truncate(n0)
    assert (rb.mode, rb.restored_at, rb.widths, rb.replay) == ("checkpoint", n0, (), 0)
    assert eng.n_past == n0 and {e.offset for e in eng.cache if isinstance(e, KVCache)} == {n0}
    want = _fed(model, [prompt], [d])
    assert np.array_equal(eng.eval([d], rows=[0]), want)
    assert (eng.restores, eng.replay_passes, eng.replayed_tokens) == (1, 0, 0)

    # the same rollback, the recurrent entries left as they were: the drafts stay in the state
    bad = SkipsRestore(model, n_ctx=64)
    bad.eval(prompt, rows=[-1])
    bad.prepare_rollback(3)
    bad.eval([a, b, c], rows=range(3))
    bad.truncate(n0)
    assert not np.allclose(bad.eval([d], rows=[0]), want, atol=1e-3)

    # beyond the checkpoint: a batch of 3 of which 2 are kept is replayed as one pass of 2
    eng = MLXEngine(model, n_ctx=64)
    eng.eval(prompt, rows=[-1])
    eng.prepare_rollback(3)
    eng.eval([a, b, c], rows=range(3))
    rb = eng.truncate(n0 + 2)
    assert (rb.restored_at, rb.widths, rb.replay, rb.replayed) == (n0, (2,), 2, 2)
    want2 = _fed(model, [prompt, [a, b]], [d])
    assert np.array_equal(eng.eval([d], rows=[0]), want2)
    skip = SkipsReplay(model, n_ctx=64)
    skip.eval(prompt, rows=[-1])
    skip.prepare_rollback(3)
    skip.eval([a, b, c], rows=range(3))
    skip.truncate(n0 + 2)
    assert not np.allclose(skip.eval([d], rows=[0]), want2, atol=1e-3)

    # after single-token passes (the serial-verify control) the replay is single-token passes
    eng = MLXEngine(model, n_ctx=64)
    eng.eval(prompt, rows=[-1])
    eng.prepare_rollback(3)
    for t in (a, b, c):
        eng.eval([t], rows=[0])
    rb = eng.truncate(n0 + 2)
    assert (rb.restored_at, rb.widths) == (n0, (1, 1))
    assert np.array_equal(eng.eval([d], rows=[0]), _fed(model, [prompt, [a], [b]], [d]))

    # further back than the latest checkpoint (a kernel map's blocks): an earlier one, replayed in its passes
    eng = MLXEngine(model, n_ctx=64)
    eng.eval(prompt, rows=[-1])
    for t in (a, b, c, d, a):
        eng.eval([t], rows=[0])
    eng.prepare_rollback(2)
    eng.eval([b, c], rows=[0, 1])
    rb = eng.truncate(n0 + 2)
    assert (rb.n_from, rb.restored_at, rb.widths) == (n0 + 7, n0, (1, 1))
    assert np.array_equal(eng.eval([d], rows=[0]), _fed(model, [prompt, [a], [b]], [d]))


def test_checkpoints_are_references_and_few(models):
    """A checkpoint keeps the arrays themselves (no copy), and no more than KEEP besides the fresh cache."""
    eng = MLXEngine(models["qwen3_5"][0], n_ctx=256)
    prompt = _prompt(eng.model)
    eng.eval(prompt, rows=[-1])
    entry = eng._history.entries[0]  # the first gated-delta-net layer: its convolution window and its state
    eng.prepare_rollback(1)
    cp = eng._history.checkpoints[-1]
    held = list(entry.cache)
    values = [np.array(x) for x in held]
    assert cp.pos == len(prompt) and all(x is y for x, y in zip(cp.arrays[0][0], held))
    for i in range(3 * KEEP):
        eng.prepare_rollback(2)
        eng.eval([5 + i, 6 + i], rows=[0, 1])
    cps = [c.pos for c in eng._history.checkpoints]
    assert cps[0] == 0 and len(cps) == KEEP + 1 and cps == sorted(cps) and cps[-1] == len(prompt) + 2 * (3 * KEEP - 1)
    # the layer has new arrays; the ones the checkpoint held were never written into
    assert all(x is not y for x, y in zip(entry.cache, held))
    assert all(np.array_equal(np.array(x), v) for x, v in zip(held, values))


# -- both arms, and the serial-verify control ---------------------------------------------------
def _rounds_add_up(arm, max_tokens):
    per_round = Counter(s.round for s in arm.steps)
    assert len(arm.tokens) == max_tokens == sum(per_round.values())
    assert per_round[0] == 1
    last = arm.rounds[-1]
    for r in arm.rounds[1:]:
        if r is not last:  # the last round may be cut short by max_tokens
            assert per_round[r.index] == r.emitted, (r, per_round[r.index])


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_arms_on_a_hybrid_equal_vanilla_under_serial_verify(arch, models):
    target, draft = models[arch]
    prompt = _prompt(target)
    opts = GenOptions(max_tokens=MAX_TOKENS, ignore_eos=True)
    vanilla = run_to_end(vanilla_greedy(MLXEngine(target, n_ctx=256), prompt, opts))
    assert len(set(vanilla.tokens)) > 10  # a real sequence, not one token repeated

    for serial in (True, False):
        eng = MLXEngine(target, n_ctx=256)
        deng = MLXEngine(draft, n_ctx=256)
        arm = run_to_end(speculative_greedy(eng, ModelDrafter(deng, n_max=N_MAX), prompt, opts,
                                            n_max_hint=N_MAX, serial_verify=serial))
        rounds = arm.rounds[1:]
        restored = [r for r in rounds if r.rollback == "checkpoint"]
        # the drafter is accepted in part, so rounds reject drafts and the target restores its checkpoint
        assert 0 < arm.n_accepted < arm.n_drafted
        assert restored and len(restored) == sum(1 for r in rounds if r.accepted < r.drafted)
        assert all(r.rollback == "" for r in rounds if r.accepted == r.drafted)
        _rounds_add_up(arm, MAX_TOKENS)
        if serial:
            # the control: every verify row and every replayed token a single-token pass, so exactly vanilla
            assert arm.tokens == vanilla.tokens
            assert eng.restores == len(restored)  # one restore per rejecting round: each replay kept its tokens
            assert all(r.replay == r.accepted + 2 for r in restored)  # [id_last] + accepted + the target's token
        else:
            assert eng.restores >= len(restored)
            if mx.default_device() == mx.cpu:  # measured: the CPU build's batched rows equal its single-token rows
                assert arm.tokens == vanilla.tokens
        # the drafter is a hybrid too: it keeps its accepted drafts, so the engine replays them itself
        assert deng.rollback_mode(1) == "checkpoint" and deng.restores > 0 and deng.replayed_tokens > 0
        assert eng.replayed_tokens == 0  # the target's replays are the loop's own verify passes


@pytest.mark.parametrize("arch", ARCHS)
def test_session_trace_and_summary_say_mlx_lm_refuses(arch, folders, models):
    from specview.commands.run import summary

    target, draft = folders[arch]
    s = Session()
    try:
        tr = s.run(RunConfig(backend="mlx", target=str(target), draft=str(draft), prompt=PROMPT_TEXT, chat=False,
                             max_tokens=32, ignore_eos=True))
    finally:
        s.close()
    if mx.default_device() == mx.cpu:
        assert tr.comparison.identical
    note = tr.models["target"]["rollback_note"]
    assert tr.models["target"]["rollback"] == tr.models["draft"]["rollback"] == "checkpoint"
    line = [ln for ln in summary(tr).splitlines() if "mlx-lm itself refuses" in ln]
    assert line == [f"note     target and draft: {note}"]
    assert any(r.rollback == "checkpoint" and r.replay > 0 for r in tr.speculative.rounds)


# -- planted faults in the restore read "state" through the control ------------------------------
@pytest.mark.parametrize("plant", [SkipsRestore, RestoresOneLate, StaleCheckpoint], ids=lambda c: c.__name__)
@pytest.mark.parametrize("arch", ARCHS)
def test_a_planted_restore_fault_reads_state(arch, plant, folders, monkeypatch):
    from specview.core.diagnose import diagnose

    made: dict[str, MLXEngine] = {}
    real_engine = Session.engine

    def new_engine(self, settings, n_ctx):  # every context on these models has the fault
        return plant(self.model, settings, n_ctx=n_ctx)

    def engine(self, role, model, settings, n_ctx):
        made[role] = real_engine(self, role, model, settings, n_ctx)
        return made[role]

    monkeypatch.setattr(MLXLoaded, "new_engine", new_engine)
    monkeypatch.setattr(Session, "engine", engine)
    target, draft = folders[arch]
    cfg = RunConfig(backend="mlx", target=str(target), draft=str(draft), prompt=PROMPT_TEXT, chat=False,
                    max_tokens=48, ignore_eos=True)
    s = Session()
    try:
        tr = s.run(cfg)
        assert not tr.comparison.identical  # the faulty restore changed the speculative text
        restored = sum(r.rollback == "checkpoint" for r in tr.speculative.rounds)
        assert restored > 0 and made["speculative"].restores >= restored  # the planted restore ran
        d = diagnose(s, s.resolve(cfg).config, tr)
    finally:
        s.close()
    assert d["verdict"] == "state" and d["rule"] == "serial-verify-differs", d["explanation"]
    sv = d["serial_verify"]
    assert sv["identical_to_vanilla"] is False and sv["vanilla_repeat"]["identical"] is True
    assert made["control-serial"].restores > 0 and all(type(e) is plant for e in made.values())
