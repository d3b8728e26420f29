"""The draft model's rollback on a tiny hybrid (tests/tinyhybrid.py), checked exactly through the real path.

A draft model whose memory holds a recurrent state rolls its drafted tokens back as llama-server's does: a
checkpoint saved before them, restored, and the kept ones decoded again.  After every such rollback the draft
context must hold exactly the tokens the drafter believes it holds, and its state must be the one a clean
context reaches by decoding those tokens in the same passes from empty: the logits row of the last token,
bit for bit.  A drafter whose rollback goes wrong only drafts worse, so nothing else in the suite would see it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyhybrid import hybrid_pair  # noqa: E402

from specview.core.arms.drafters import ModelDrafter  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.session import Session  # noqa: E402

ARCHS = ("qwen35", "lfm2")
N = 40


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft-rollback")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


def rebuilt_row(clean, tokens: list[int], passes: list[int]) -> np.ndarray:
    """The last token's row after ``tokens`` decoded in passes of ``passes`` widths on a clean context."""
    clean.reset()
    assert sum(passes) == len(tokens), (passes, len(tokens))
    start, row = 0, None
    for w in passes:
        row = clean.eval(tokens[start:start + w], rows=[-1])[0]
        start += w
    return row


@pytest.mark.parametrize("mode", ["checkpoint", "snapshots"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_draft_rollback_leaves_the_state_a_clean_context_reaches(pairs, arch, mode, monkeypatch):
    target, draft = pairs[arch]
    cfg = RunConfig(target=str(target), draft=str(draft), prompt="the cat and the dog", chat=False, max_tokens=N,
                    ignore_eos=True, n_max=3, engine=EngineSettings(threads=1, rollback=mode))
    checked: list[int] = []
    clean_of: dict[int, object] = {}
    real_sync = ModelDrafter._sync

    def sync(self, seq, n_history):
        before = self.engine.rollbacks()
        row = real_sync(self, seq, n_history)
        after = self.engine.rollbacks()
        if after.get("checkpoint", 0) > before.get("checkpoint", 0):  # this sync rolled back by a checkpoint
            mem = self.engine.memory
            assert mem.tokens == list(seq), "the draft context does not hold the tokens the drafter synced"
            clean = clean_of.setdefault(id(self), self.engine.sibling())
            assert np.array_equal(row, rebuilt_row(clean, list(mem.tokens), list(mem.passes)))
            checked.append(len(seq))
        return row

    monkeypatch.setattr(ModelDrafter, "_sync", sync)
    session = Session()
    try:
        trace = session.run(cfg)
    finally:
        for c in clean_of.values():
            c.close()
        session.close()
    assert trace.config["context_used"]["draft_rollback"] == "checkpoint"  # llama-server's: n_rs_seq = 0
    used = trace.speculative.rollbacks["draft"]
    assert used["checkpoint"] == len(checked) > 0 and used["n_rs_seq"] == 0
    # a rollback that kept drafted tokens decoded them again; one that kept none replays nothing
    assert 0 < used["replay"] <= used["checkpoint"]
