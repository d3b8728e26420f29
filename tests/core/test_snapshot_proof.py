"""The verdict vouches only for the rollback paths something walked: n_rs_seq snapshots that neither the
serial-verify control (one-token passes never keep a snapshot) nor the snapshot check covered leave a fork
"inconclusive", whatever its gap under the far threshold; a gap far beyond it, or a control that differs,
still reads "state"."""

from __future__ import annotations

import pytest

from specview.core.diagnose import classify, format_verdict
from specview.core.diagnose.controls import snapshot_rollbacks
from specview.core.diagnose.words import mechanisms_words, serial_line, snapshot_line
from specview.core.trace import ArmResult, Round


@pytest.mark.parametrize("gap", [0.0, 0.01, 0.5, 1.99])
def test_unproven_snapshots_never_read_near_tie_whatever_the_gap_under_far(gap):
    assert classify(identical=False, gap=gap, env_max=0.3, serial_verify_identical=True, unproven=31) == (
        "inconclusive", "snapshot-restore-unproven")
    # the same fork with the snapshots proven (or none used) is the proven near-tie
    assert classify(identical=False, gap=gap, env_max=0.3, serial_verify_identical=True, unproven=0) == (
        "near-tie", "serial-verify-reproduces-vanilla")


def test_unproven_snapshots_still_read_state_where_something_proves_a_bug():
    assert classify(identical=False, gap=12.2, env_max=0.3, serial_verify_identical=True, unproven=31) == (
        "state", "gap-far-beyond-envelope")
    assert classify(identical=False, gap=0.1, env_max=0.3, serial_verify_identical=False,
                    vanilla_repeat_identical=True, unproven=31) == ("state", "serial-verify-differs")
    assert classify(identical=False, gap=None, serial_verify_identical=True, unproven=3) == (
        "inconclusive", "snapshot-restore-unproven")
    assert classify(identical=True, unproven=31) == ("identical", "identical")


def _arm(rollbacks=None, rounds=()):
    arm = ArmResult(name="speculative", rollbacks=rollbacks or {})
    arm.rounds = [Round(index=0, drafted=0, accepted=0, draft_ms=0, verify_ms=0, batch_size=3, first_step=0),
                  *rounds]
    return arm


def test_snapshot_rollbacks_read_the_record_or_else_the_batched_snapshot_rounds():
    class T:
        speculative = _arm({"target": {"n_rs_seq": 31, "state-copy": 2}})

    assert snapshot_rollbacks(T) == 31
    rounds = [Round(index=i, drafted=3, accepted=1, draft_ms=0, verify_ms=0, batch_size=4, first_step=i,
                    rollback=rb, serial=serial)
              for i, (rb, serial) in enumerate([("snapshots", False), ("snapshots", True), ("state-copy", True),
                                                ("snapshots", False)], start=1)]

    class Old:  # a trace written before arms recorded their rollbacks
        speculative = _arm(None, rounds)

    assert snapshot_rollbacks(Old) == 2


def test_the_words_say_what_the_control_walked_and_what_stays_unproven():
    sv = {"form": "single-token-passes", "identical_to_vanilla": True, "n_tokens": 48, "unproven": 31,
          "rollbacks": {"target": {"seq-rm": 0, "n_rs_seq": 0, "state-copy": 60, "checkpoint": 0, "replay": 0}},
          "snapshot_check": {"identical_to_speculative": False, "first_mismatch": 17, "n_tokens": 18,
                             "rollbacks": {"target": {"checkpoint": 9, "replay": 9}}}}
    line = serial_line(sv)
    assert "state-copy ×60" in line and "UNPROVEN" in line and "--rollback checkpoint" in line
    assert "(proven)" not in line
    snap = snapshot_line(sv)
    assert "DIFFERS" in snap and "token 17" in snap and "checkpoint ×9, replay ×9" in snap
    assert mechanisms_words({"target": {"n_rs_seq": 0}}) == "no rollback"
    diag = {"verdict": "inconclusive", "rule": "snapshot-restore-unproven", "serial_verify": sv, "explanation": "x"}
    text = format_verdict(diag)
    assert "VERDICT  INCONCLUSIVE" in text and "snapshot check  DIFFERS" in text
