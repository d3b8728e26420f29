"""The proof on the path the serial-verify control cannot walk: llama.cpp's n_rs_seq snapshots.

On the tiny hybrids (tests/tinyhybrid.py) in ``--rollback snapshots``: the speculative arm rolls back through
n_rs_seq snapshots (kept for the positions of its multi-token verify passes), the serial-verify control only
through state copies (its passes are one token wide), and the trace and the diagnosis say so.  A fault planted
in the real snapshot path (``plants_rollback.plant_in_memory``: the snapshot one position too far back) leaves
the control identical to vanilla, so only the snapshot check stands between it and a proven near-tie: the
verdict reads ``state`` or ``inconclusive`` (snapshot-restore-unproven), never ``near-tie``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from plants_rollback import plant_in_memory  # noqa: E402
from tinyhybrid import hybrid_pair  # noqa: E402

from specview.core import diagnose as dmod  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.session import Session  # noqa: E402

ARCHS = ("qwen35", "lfm2")
PROMPTS = ("the cat and the dog", "a model of the target", "history of the essay")
N = 48


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("snapshots")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


def config(pairs, arch: str, prompt: str) -> RunConfig:
    target, draft = pairs[arch]
    return RunConfig(target=str(target), draft=str(draft), prompt=prompt, chat=False, max_tokens=N, ignore_eos=True,
                     n_max=3, engine=EngineSettings(threads=1, rollback="snapshots"))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_fault_in_the_snapshot_path_never_reads_a_proven_near_tie(pairs, arch, monkeypatch):
    fired = plant_in_memory(monkeypatch, "snapshot-one-back")
    session = Session()
    try:
        for prompt in PROMPTS:
            cfg = config(pairs, arch, prompt)
            trace = session.run(cfg)
            if not trace.comparison.identical:
                d = dmod.diagnose(session, session.resolve(cfg).config, trace)
                break
        else:
            pytest.fail(f"the planted snapshot fault never changed the speculative text ({len(fired)} firings)")
    finally:
        session.close()
    assert fired, "the fault never fired"
    spec = trace.speculative.rollbacks["target"]
    assert spec["n_rs_seq"] > 0 and spec["state-copy"] == 0  # the arm rolled back through the snapshots
    sv = d["serial_verify"]
    walked = sv["rollbacks"]["target"]
    assert walked["n_rs_seq"] == 0 and walked["state-copy"] > 0  # the control never walked them
    assert d["verdict"] in ("state", "inconclusive"), d["explanation"]
    if sv["identical_to_vanilla"]:
        chk = sv["snapshot_check"]
        # the check walked checkpoints and replays, never a snapshot, and did not give the faulty arm's tokens
        assert chk["rollbacks"]["target"]["n_rs_seq"] == 0
        assert chk["rollbacks"]["target"]["checkpoint"] == chk["rollbacks"]["target"]["replay"] > 0
        assert chk["identical_to_speculative"] is False and chk["first_mismatch"] is not None
        assert (d["rule"], sv["unproven"]) in (("gap-far-beyond-envelope", spec["n_rs_seq"]),
                                               ("snapshot-restore-unproven", spec["n_rs_seq"]))
        text = dmod.format_verdict(d)
        assert "snapshot check  DIFFERS" in text and "(proven)" not in text
    else:  # the fault also reached a state the control copies: proven a state bug
        assert d["rule"] == "serial-verify-differs"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_snapshot_check_walks_no_snapshot_and_compares_every_token(pairs, arch):
    cfg = config(pairs, arch, PROMPTS[0])
    session = Session()
    try:
        trace = session.run(cfg)
        resolved = session.resolve(cfg)
        target = session.model(cfg.backend, cfg.target, resolved.settings)
        from specview.core.arms.generate import GenOptions
        from specview.core.diagnose.controls import snapshot_check

        opts = GenOptions(max_tokens=N, ignore_eos=True, n_batch=resolved.config.engine.n_batch)
        chk = snapshot_check(session, resolved.config, trace, target, 512, opts, lambda m: None, lambda: False)
    finally:
        session.close()
    spec = trace.speculative
    rejected = [r for r in spec.rounds[1:] if r.accepted < r.drafted]
    assert spec.rollbacks["target"]["n_rs_seq"] == len(rejected) > 0
    used = chk["rollbacks"]["target"]
    assert used["n_rs_seq"] == 0 and used["state-copy"] == 0
    # it drafts what the arm drafted for as long as the two agree, so it rejects where the arm did
    assert used["checkpoint"] == used["replay"] > 0
    if chk["identical_to_speculative"]:
        assert chk["n_tokens"] == len(spec.tokens) and used["checkpoint"] == len(rejected)
    else:
        assert chk["n_tokens"] == chk["first_mismatch"] + 1
