"""The app on a hybrid target: the acceptance plot marks each round that a checkpoint restore and a replay
rolled back, and says how many; a run without replays shows no such mark."""

from __future__ import annotations

import os

import pytest

from specview.core.config import EngineSettings, RunConfig
from specview.core.session import Session

from tinyhybrid import hybrid_pair

pytestmark = pytest.mark.demo


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return hybrid_pair("lfm2", tmp_path_factory.mktemp("lfm2"))


def _trace(pair, rollback: str):
    target, draft = pair
    threads = int(os.environ.get("SPECVIEW_THREADS") or 1)
    cfg = RunConfig(target=str(target), draft=str(draft), spec_type="draft-simple", n_max=3, max_tokens=48,
                    ignore_eos=True, prompt="the cat sat on the mat and the dog", chat=False,
                    engine=EngineSettings(rollback=rollback, threads=threads))
    with Session() as s:
        return s.run(cfg)


def test_the_acceptance_plot_marks_the_rounds_that_replayed(make_window, lfm2):
    trace = _trace(lfm2, "checkpoint")
    replayed = [r for r in trace.speculative.rounds if r.replay]
    assert replayed, "the tiny LFM2 pair rejects drafts, so a checkpoint run replays"
    w = make_window()
    w.show_trace(trace)
    plot = w.acceptance
    xs, ys = plot.replays.getData()
    assert sorted(int(x) for x in xs) == sorted(r.index for r in replayed)
    assert all(y == pytest.approx(r.drafted + 0.35) for y, r in zip(ys, sorted(replayed, key=lambda r: r.index)))
    assert plot.n_replayed == len(replayed) and f"{len(replayed)} replayed" in plot.summary
    assert "replayed" in [label.text for _item, label in plot.legend.items]


def test_snapshots_replay_nothing_and_show_no_mark(make_window, lfm2):
    trace = _trace(lfm2, "snapshots")
    assert not any(r.replay for r in trace.speculative.rounds)
    assert any(r.rollback == "snapshots" for r in trace.speculative.rounds)
    w = make_window()
    w.show_trace(trace)
    plot = w.acceptance
    assert len(plot.replays.getData()[0]) == 0 and plot.n_replayed == 0
    assert "replayed" not in plot.summary
    assert "replayed" not in [label.text for _item, label in plot.legend.items]
