"""tests/forks.py's hints: within one run, a search tries first the candidate an earlier search of its kind found
forking, and still finds the fork it would find without the hint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from forks import CANDIDATES, HINTS_ENV, HINTS_PREFIX, NoFork, new_hints_folder, search


class Runs:
    """A run function whose traces fork exactly for the candidates (by index in CANDIDATES) it is told."""

    def __init__(self, forking: set[int]):
        self.forking = forking
        self.ran: list[int] = []

    def __call__(self, cfg):
        i = next(i for i, c in enumerate(CANDIDATES) if c.config(threads=cfg.engine.threads) == cfg)
        self.ran.append(i)
        fm = SimpleNamespace(index=5, vanilla_token=1, speculative_token=2) if i in self.forking else None
        return SimpleNamespace(comparison=SimpleNamespace(first_mismatch=fm), vanilla=SimpleNamespace(tokens=[0] * 9))


@pytest.fixture
def hints(tmp_path, monkeypatch):
    monkeypatch.setenv(HINTS_ENV, str(tmp_path))
    return tmp_path


def test_a_second_search_of_a_kind_starts_at_the_fork_the_first_found(hints):
    first = Runs({3, 5})
    fork = search(first, threads=1, kind="Session")
    assert (fork.candidate, first.ran) == (CANDIDATES[3], [0, 1, 2, 3])
    assert len(fork.tried) == 3 and CANDIDATES[0].describe() in fork.tried[0]
    assert [p.read_text().strip() for p in hints.iterdir()] == [CANDIDATES[3].describe()]

    second = Runs({3, 5})
    fork = search(second, threads=1, kind="Session")
    assert (fork.candidate, second.ran, fork.tried) == (CANDIDATES[3], [3], [])


def test_a_hint_that_no_longer_forks_is_followed_by_the_rest_in_order(hints):
    search(Runs({3}), threads=1, kind="Session")
    runs = Runs({1, 5})
    fork = search(runs, threads=1, kind="Session")
    # the hinted candidate first, then from the top: the fork an unhinted search finds
    assert (fork.candidate, runs.ran) == (CANDIDATES[1], [3, 0, 1])
    unhinted = search(Runs({1, 5}), threads=1)
    assert unhinted.candidate == fork.candidate
    # and the hint now names the new fork
    again = Runs({1, 5})
    assert search(again, threads=1, kind="Session").candidate == CANDIDATES[1] and again.ran == [1]


def test_hints_are_kept_apart_by_kind_threads_candidates_and_the_planted_probe(hints, monkeypatch):
    search(Runs({4}), threads=1, kind="Session")
    for kw in (dict(threads=1, kind="llama-server"), dict(threads=2, kind="Session"),
               dict(candidates=CANDIDATES[:6], threads=1, kind="Session")):
        runs = Runs({4})
        search(runs, **kw)
        assert runs.ran == [0, 1, 2, 3, 4], kw
    if os.environ.get("SPECVIEW_REPACK_PROBE"):  # CI's planted-crash pass
        monkeypatch.delenv("SPECVIEW_REPACK_PROBE")
    else:
        monkeypatch.setenv("SPECVIEW_REPACK_PROBE", "crashed")
    runs = Runs({4})
    search(runs, threads=1, kind="Session")
    assert runs.ran == [0, 1, 2, 3, 4]


def test_no_kind_or_no_folder_means_no_hints(hints, monkeypatch):
    search(Runs({2}), threads=1)
    assert list(hints.iterdir()) == []
    monkeypatch.delenv(HINTS_ENV)
    search(Runs({2}), threads=1, kind="Session")
    runs = Runs({2})
    search(runs, threads=1, kind="Session")
    assert runs.ran == [0, 1, 2] and list(hints.iterdir()) == []
    with pytest.raises(NoFork):
        search(Runs(set()), CANDIDATES[:2], threads=1, kind="Session")


def test_the_run_has_one_hints_folder_its_lanes_share():
    folder = os.environ.get(HINTS_ENV)
    assert folder and os.path.isdir(folder), "tests/conftest.py makes the run's folder before the lanes start"
    m = re.fullmatch(rf"{HINTS_PREFIX}(\d+)-\w+", os.path.basename(folder))
    assert m, f"{folder}: named by the process that made it, so a later run can tell when it is gone"
    os.kill(int(m.group(1)), 0)  # the run's controller: alive while its lanes run


def test_a_killed_runs_folder_is_removed_by_the_next_run(tmp_path):
    """A run stopped from outside never reaches its clean-up; the next run removes a folder whose process is gone
    and leaves alone one whose process runs (another run at the same time) and anything not named as its own."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = tmp_path / f"{HINTS_PREFIX}{int(gone.stdout)}-abc_123"
    live = tmp_path / f"{HINTS_PREFIX}{os.getppid()}-def456"
    other = [tmp_path / f"{HINTS_PREFIX}x1y2z3", tmp_path / f"{HINTS_PREFIX}notapid-1", tmp_path / "unrelated"]
    for d in (dead, live, *other):
        d.mkdir()
        (d / "hint.txt").write_text("Q4_K_M\n", encoding="utf-8")
    made = new_hints_folder(str(tmp_path))
    assert not dead.exists()
    assert live.is_dir() and all(d.is_dir() for d in other)
    assert os.path.dirname(made) == str(tmp_path) and os.path.basename(made).startswith(f"{HINTS_PREFIX}{os.getpid()}-")
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(made), *(d.name for d in (live, *other))])
