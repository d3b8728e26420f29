"""Suite cells on the real demo model: a cell stopped a few tokens after its fork keeps the full run's fork.

The fork is found on this machine (tests/forks.py tries a short fixed list of configurations), then run as a
matrix cell with ``stop_after_fork`` on a fresh session and compared with the full run: the same vanilla arm,
a speculative arm that is a prefix of the full one, the same first mismatch, stopped within one round of
``fork + N``.
"""

from __future__ import annotations

import pytest

from forks import find_fork
from specview.core.matrix import MatrixSpec, PromptSpec, expand, rates, run_matrix
from specview.core.session import Session

pytestmark = pytest.mark.demo

N = 4


def test_a_natural_fork_stopped_after_n_tokens(tmp_path):
    full_session = Session()
    try:
        fork = find_fork(full_session)
    finally:
        full_session.close()
    cfg, full = fork.cfg, fork.trace
    spec = MatrixSpec(targets=[cfg.target], drafters=[cfg.draft], n_max=[cfg.n_max], p_min=[cfg.p_min],
                      flash_attn=[cfg.engine.flash_attn], prompts=[PromptSpec("found", text=cfg.prompt, chat=cfg.chat,
                                                                             category="essay")],
                      max_tokens=cfg.max_tokens, engine=cfg.engine, stop_after_fork=N, diagnose=False)
    assert len(expand(spec)) == 1
    session = Session()
    try:
        run = run_matrix(spec, session, out=tmp_path / "m.json", traces_dir=tmp_path / "t")
    finally:
        session.close()
    from specview.core.trace import Trace

    rec = run.records[0]
    stopped = Trace.load(tmp_path / rec["trace"])
    assert stopped.vanilla.tokens == full.vanilla.tokens
    assert rec["first_mismatch"] == fork.index, fork.describe()
    n = len(stopped.speculative.tokens)
    assert stopped.speculative.tokens == full.speculative.tokens[:n]
    if fork.index + N + 1 < len(full.speculative.tokens):
        assert stopped.speculative.stop_reason == "after-fork"
        assert fork.index + N < n <= fork.index + N + 1 + cfg.n_max
    g = rates(run.to_json())["settings"][0]
    assert (g["n"], g["forks"], g["positions"]["values"]) == (1, 1, [fork.index])
