"""The llama.cpp engine's fast paths give what its plain paths give, on the tiny hybrid models (tests/tinyhybrid.py).

``LlamaEngine.eval`` takes two shortcuts where a pass is small: a single plain ``int`` token with one row skips
the general argument checks, and the logits of a small vocabulary are copied through a buffer of the engine's
own rather than into a new array by its ``.ctypes`` address.  Neither may change a bit of what a run computes:

* a whole speculative run in each rollback mode (checkpoint restores, replays, snapshots, the draft model's
  rollbacks) gives the same tokens, drafts and recorded logits with both shortcuts taken as with neither (token
  ids given as numpy integers, which only the general checks take, and the buffer switched off);
* the rows ``eval`` returns are the engine's logits, in a new array each pass: a later pass leaves an earlier
  row as it was, and one pass's rows equal those a context without the buffer returns for the same tokens;
* the shortcut refuses what the general checks refuse, with their errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import door
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyhybrid import hybrid_pair  # noqa: E402

from specview.backends.llama_cpp.engine import LlamaEngine  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.errors import EvalError  # noqa: E402
from specview.core.session import Session  # noqa: E402

ARCHS = ("lfm2", "qwen35")
N = 48


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast-paths")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


def run(pairs, arch: str, mode: str, *, fast: bool, monkeypatch) -> tuple[object, dict[str, int]]:
    """A speculative run (p_min 0, so every round drafts n_max tokens) and how often each path was taken."""
    target, draft = pairs[arch]
    cfg = RunConfig(target=str(target), draft=str(draft), spec_type="draft-simple", n_max=3, p_min=0.0,
                    prompt="the cat sat on the mat and the dog ran", chat=False, max_tokens=N, ignore_eos=True,
                    engine=EngineSettings(threads=1, rollback=mode))
    counts = {"eval": 0, "checked": 0, "buffered": 0}
    real_eval, real_checked, real_rows = LlamaEngine.eval, LlamaEngine.checked, LlamaEngine._rows_out

    def eval_(self, tokens, rows):
        counts["eval"] += 1
        if not fast:  # numpy ids: only the general checks take them
            tokens = np.asarray(list(tokens), dtype=np.int64)
            self._small_rows = 0  # and no buffer: every row straight into its new array
        return real_eval(self, tokens, rows)

    def checked(self, tokens, rows, **kw):
        counts["checked"] += 1
        return real_checked(self, tokens, rows, **kw)

    def rows_out(self, rows):
        counts["buffered"] += len(rows) <= self._small_rows
        return real_rows(self, rows)

    monkeypatch.setattr(LlamaEngine, "eval", eval_)
    monkeypatch.setattr(LlamaEngine, "checked", checked)
    monkeypatch.setattr(LlamaEngine, "_rows_out", rows_out)
    try:
        with Session() as s:
            trace = s.run(cfg, reuse_vanilla=False)
    finally:
        monkeypatch.undo()
    return trace, counts


@pytest.mark.parametrize("mode", ["checkpoint", "snapshots"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_run_with_the_fast_paths_equals_one_without_them(pairs, arch, mode, monkeypatch):
    fast, fc = run(pairs, arch, mode, fast=True, monkeypatch=monkeypatch)
    slow, sc = run(pairs, arch, mode, fast=False, monkeypatch=monkeypatch)
    # the shortcuts were taken: most passes are single drafted tokens, which skip the checks and use the buffer
    assert fc["eval"] == sc["eval"] > 0
    assert fc["checked"] < fc["eval"] / 2 and fc["buffered"] == fc["eval"]
    assert sc["checked"] == sc["eval"] and sc["buffered"] == 0
    for a, b in ((fast.vanilla, slow.vanilla), (fast.speculative, slow.speculative)):
        assert a.tokens == b.tokens and len(a.tokens) == N
        assert [(s.top_ids, s.top_logits, s.margin) for s in a.steps] == \
               [(s.top_ids, s.top_logits, s.margin) for s in b.steps]
    fs, ss = fast.speculative, slow.speculative
    assert [r.draft_tokens for r in fs.rounds] == [r.draft_tokens for r in ss.rounds]
    assert (fs.n_drafted, fs.n_accepted, fs.rollbacks) == (ss.n_drafted, ss.n_accepted, ss.rollbacks)
    assert sum(fs.rollbacks["target"].values()) > 0  # rejections rolled the target back: the paths were walked
    assert fs.tokens == fast.vanilla.tokens  # and greedy speculative decoding stayed lossless


@pytest.mark.parametrize("arch", ARCHS)
def test_the_buffered_rows_are_the_logits_in_a_new_array_each_pass(pairs, arch):
    target, _ = pairs[arch]
    m = door.model(target)
    s = door.settings(target=target, threads=1, rollback="checkpoint")
    a, b = door.context(m, s, n_ctx=256), door.context(m, s, n_ctx=256)
    try:
        assert 0 < 4 <= a._small_rows  # the tiny vocabulary's rows fit the buffer
        b._small_rows = 0
        prompt = m.tokenize("the cat and the dog")
        for e in (a, b):
            e.eval(prompt, rows=[-1])
        ra, rb = a.eval([40, 41, 42, 43], rows=range(4)), b.eval([40, 41, 42, 43], rows=range(4))
        assert ra.shape == (4, m.n_vocab) and ra.dtype == np.float32
        assert ra.tobytes() == rb.tobytes()
        first = ra.copy()
        one_a, one_b = a.eval([44], rows=[0]), b.eval([44], rows=[0])
        assert one_a.tobytes() == one_b.tobytes() and not np.array_equal(one_a[0], ra[0])
        assert ra.tobytes() == first.tobytes()  # the next pass wrote the buffer, not the rows returned before
        assert not np.shares_memory(one_a, ra)
    finally:
        a.close()
        b.close()


def test_the_single_token_shortcut_refuses_what_the_checks_refuse(pairs):
    target, _ = pairs["lfm2"]
    m = door.model(target)
    e = door.context(m, door.settings(target=target, threads=1, rollback="checkpoint"), n_ctx=256)
    try:
        with pytest.raises(EvalError, match=f"token id {m.n_vocab} is outside the vocabulary"):
            e.eval([m.n_vocab], rows=[0])
        with pytest.raises(EvalError, match="token id -1 is outside"):
            e.eval([-1], rows=[0])
        with pytest.raises(ValueError, match=r"rows \[1\] are outside the 1 tokens"):
            e.eval([5], rows=[1])
        assert e.n_past == 0  # nothing refused reached llama.cpp
        e.eval([5] * (e.n_ctx - 1), rows=[-1])
        e.eval([5], rows=[-1])  # the last free position, through the shortcut
        with pytest.raises(EvalError, match="the context is full"):
            e.eval([5], rows=[0])
    finally:
        e.close()
