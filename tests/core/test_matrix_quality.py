"""A matrix over a task suite: each cell's two answers scored, and per setting whether speculation changed them.

A fake runner answers every item of the generated ``arithmetic`` suite: the
vanilla arm always right, the speculative arm wrong on planted items of the
draft-model setting (its text forks at the answer's last digit).  What each
cell records, the per-setting counts and McNemar's p are checked against what
the plant implies, computed independently here; resumption keeps the scored
cells and scores the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from answers import AnswerRunner as Answers
from answers import wrong

from specview import cli
from specview.core.matrix import MatrixError, MatrixSpec, load_matrix, run_matrix
from specview.core.matrix.quality import answers_text, suite_block, task_prompts
from specview.core.matrix.rates import format_rates
from specview.core.quality import answer_changed, load_suite
from specview.core.trace import Trace

N_ITEMS = 6
PLANTED = (1, 3, 4)  # the items the speculative arm answers wrong, where it drafts


def mcnemar_by_formula(b: int, c: int) -> float:
    n, k = b + c, min(b, c)
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


@pytest.fixture()
def suite():
    return load_suite("arithmetic", n=N_ITEMS, seed=0)


def spec_of(suite, **kw) -> MatrixSpec:
    d = dict(targets=["demo:Q8_0"], drafters=["demo:Q4_0", "none"], n_max=[3], p_min=[0.0], flash_attn=["auto"],
             prompts=task_prompts(suite), max_tokens=64, diagnose=False,
             quality=suite_block("arithmetic", N_ITEMS, 0))
    d.update(kw)
    return MatrixSpec(**d)


def AnswerRunner(suite):  # noqa: N802 - the runner of the planted answers
    return Answers(suite, PLANTED)


def test_each_cell_scores_both_arms_and_each_setting_counts_the_changed_answers(suite, tmp_path: Path):
    runner = AnswerRunner(suite)
    run = run_matrix(spec_of(suite), runner, out=tmp_path / "m.json", traces_dir=tmp_path / "traces")
    doc = load_matrix(tmp_path / "m.json")
    assert doc["status"] == "complete" and len(doc["cells"]) == 2 * N_ITEMS
    ids = [it.id for it in suite.items]
    for c in doc["cells"]:
        q = c["quality"]
        i = ids.index(c["params"]["prompt"])
        planted = c["params"]["drafter"] == "demo:Q4_0" and i in PLANTED
        assert q["item"] == ids[i] and q["expected"] == suite.items[i].answer
        assert q["vanilla_pass"] is True and q["speculative_pass"] is (not planted)
        assert q["vanilla_got"] == suite.items[i].answer
        assert q["speculative_got"] == (wrong(suite.items[i].answer) if planted else suite.items[i].answer)
        assert c["identical"] is (not planted)
        # the saved trace carries the block specview quality writes: the card and the report read it
        t = Trace.load(tmp_path / c["trace"])
        assert answer_changed(t) is planted
        assert t.config["quality"]["speculative_got"] == q["speculative_got"]
    by_drafter = {g["params"]["drafter"]: g["answers"] for g in run.to_json()["rates"]["settings"]}
    a, none = by_drafter["demo:Q4_0"], by_drafter["none"]
    assert (a["both_pass"], a["only_vanilla"], a["only_speculative"], a["both_fail"]) == (N_ITEMS - 3, 3, 0, 0)
    assert a["same"] + a["changed"] == a["n"] == N_ITEMS and a["changed"] == len(PLANTED)
    assert a["p"] == pytest.approx(mcnemar_by_formula(3, 0)) == 0.25
    assert none["changed"] == 0 and none["p"] == 1.0 and none["same"] == N_ITEMS
    assert answers_text(a).startswith("answers: 3 same / 3 changed (p=0.25)")
    lines = format_rates(doc["rates"])
    assert any(line.endswith(answers_text(none)) for line in lines)


def test_a_resumed_matrix_keeps_its_scored_cells_and_scores_the_rest(suite, tmp_path: Path):
    out = tmp_path / "m.json"
    first = AnswerRunner(suite)
    stopped = run_matrix(spec_of(suite), first, out=out, cancel=lambda: len(first.calls) >= 5)
    assert stopped.status == "interrupted"
    kept = load_matrix(out)
    assert 0 < len(kept["cells"]) < 2 * N_ITEMS and all("quality" in c for c in kept["cells"])
    second = AnswerRunner(suite)
    run_matrix(spec_of(suite), second, out=out, resume=kept)
    doc = load_matrix(out)
    assert len(second.calls) == 2 * N_ITEMS - len(kept["cells"])  # only the others ran
    assert [c for c in doc["cells"] if c["index"] in {k["index"] for k in kept["cells"]}] == kept["cells"]
    whole = run_matrix(spec_of(suite), AnswerRunner(suite)).to_json()
    assert [g["answers"] for g in doc["rates"]["settings"]] == [g["answers"] for g in whole["rates"]["settings"]]
    # another task suite is another matrix: refused, the file untouched
    before = out.read_bytes()
    other = load_suite("arithmetic", n=N_ITEMS, seed=1)
    with pytest.raises(MatrixError, match="other axes or settings"):
        run_matrix(spec_of(other, quality=suite_block("arithmetic", N_ITEMS, 1)), AnswerRunner(other), out=out,
                   resume=doc)
    assert out.read_bytes() == before


def test_a_code_suite_without_execute_and_a_cell_cut_short_are_refused_before_any_cell_runs(tmp_path: Path):
    f = tmp_path / "code.jsonl"
    f.write_text(json.dumps({"id": "add", "prompt": "def add(a, b):\n", "entry_point": "add",
                             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}) + "\n")
    code = load_suite(str(f))
    runner = AnswerRunner(load_suite("arithmetic", n=N_ITEMS, seed=0))
    with pytest.raises(MatrixError, match="--execute"):
        run_matrix(spec_of(code, quality=suite_block(str(f))), runner)
    arith = load_suite("arithmetic", n=N_ITEMS, seed=0)
    with pytest.raises(MatrixError, match="--stop-after-fork"):
        run_matrix(spec_of(arith, stop_after_fork=4), runner)
    assert runner.calls == []


def test_the_command_line_names_a_task_suite_by_the_spelling_of_specview_quality(capsys):
    assert cli.main(["matrix", "--suite", "arithmetic", "--items", "4", "--drafters", "demo:Q4_0,none",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("8 cells") and "arithmetic-" in out
    # the categories of the prompt suite keep their meaning
    assert cli.main(["matrix", "--suite", "translation", "--dry-run"]) == 0
    assert "arithmetic" not in capsys.readouterr().out
    for argv, words in ((["--items", "3"], "--items goes with a task suite"),
                        (["--suite", "arithmetic", "-p", "hi"], "runs only its items")):
        assert cli.main(["matrix", *argv, "--dry-run"]) == 2
        assert words in capsys.readouterr().err


def test_a_matrix_file_with_a_malformed_quality_block_is_refused_naming_the_field(suite, tmp_path: Path):
    out = tmp_path / "m.json"
    run_matrix(spec_of(suite), AnswerRunner(suite), out=out)
    doc = json.loads(out.read_text())
    doc["cells"][0]["quality"]["vanilla_pass"] = "yes"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(MatrixError, match=r"cells\[0\]\.quality\.vanilla_pass"):
        load_matrix(bad)
