"""A matrix over the rollback of a hybrid target's memory says when snapshots and checkpoint-and-replay give
different text (planted cell records), and each finished cell records which text its speculative arm gave."""

from __future__ import annotations

import hashlib

from specview.core.matrix.cells import CellParams, token_digest
from specview.core.matrix.summary import summarize


def _cell(index: int, rollback: str, digest: str, *, identical: bool = True, n_max: int = 3) -> dict:
    params = CellParams(target="hybrid.gguf", drafter="draft.gguf", prompt="essay", n_max=n_max, p_min=0.0,
                        rollback=rollback)
    return {"index": index, "params": params.to_json(), "status": "ok", "identical": identical,
            "first_mismatch": None if identical else 40, "verdict": "identical" if identical else "near-tie",
            "speculative_digest": digest, "gap": None}


def _doc(cells: list[dict]) -> dict:
    return {"cells": cells, "n_cells": len(cells), "spec": {}}


def test_the_digest_is_a_hash_of_the_speculative_tokens():
    tokens = [5, 17, 3, 3, 9]
    assert token_digest(tokens) == hashlib.sha256(b"5,17,3,3,9").hexdigest()[:16]
    assert token_digest(tokens) != token_digest(tokens[:-1])


def test_rollbacks_that_give_other_text_are_a_finding():
    cells = [_cell(0, "snapshots", "aaaa"), _cell(1, "checkpoint", "bbbb", identical=False),
             _cell(2, "snapshots", "cccc", n_max=1), _cell(3, "checkpoint", "cccc", n_max=1)]
    lines = summarize(_doc(cells), kernel_map=False)
    found = [x for x in lines if x.startswith("The rollback changes the text")]
    assert len(found) == 1 and "1 of 2 pairs" in found[0] and "rollback=checkpoint" in found[0]


def test_rollbacks_that_agree_are_said_to_agree():
    cells = [_cell(0, "snapshots", "aaaa"), _cell(1, "checkpoint", "aaaa"),
             _cell(2, "snapshots", "cccc", n_max=1), _cell(3, "checkpoint", "cccc", n_max=1)]
    lines = summarize(_doc(cells), kernel_map=False)
    assert "The rollbacks compared (checkpoint and snapshots) give the same speculative text in all 2 pairs of " \
           "cells." in lines
    assert not any(x.startswith("The rollback changes the text") for x in lines)


def test_a_matrix_without_a_rollback_axis_says_nothing_of_it():
    a, b = _cell(0, "snapshots", "aaaa"), _cell(1, "snapshots", "bbbb", n_max=1)
    assert not any("rollback" in x.lower() for x in summarize(_doc([a, b]), kernel_map=False))
