"""The progress estimate of long work on a slow backend (the kernel map, the backend check, the prescription)."""

from __future__ import annotations

import pytest

from specview.core.eta import WorkEta, duration_text


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_estimate_weighs_each_kind_of_unit_by_its_own_cost():
    clock = Clock()
    eta = WorkEta({1: 4, 9: 2}, label="map", every=1000.0, clock=clock)
    assert eta.remaining() is None
    clock.t += 1.0
    assert eta.done(1) is None  # a quick first unit is not worth a line
    clock.t += 1.0
    eta.done(1)
    # two narrow units at 1 s: the two left of them 2 s, the wide ones (none seen) at the mean, 1 s each
    assert eta.remaining() == pytest.approx(4.0)
    clock.t += 30.0  # the first wide pass compiles its pipeline
    line = eta.done(9, what="width 9")
    assert line is not None and "width 9" in line and "its first took 30 s" in line and "3/6" in line
    assert eta.remaining() == pytest.approx(2 * 1.0 + 1 * 30.0)
    for _ in range(2):
        clock.t += 1.0
        eta.done(1)
    clock.t += 2.0
    last = eta.done(9)
    assert last is not None and "6/6" in last and "done in 36 s" in last


def test_lines_come_at_most_every_so_often():
    clock = Clock()
    eta = WorkEta({"a": 100}, label="check", every=10.0, clock=clock)
    lines = []
    for _ in range(99):
        clock.t += 1.0
        lines.append(eta.done("a"))
    said = [x for x in lines if x]
    assert 8 <= len(said) <= 10 and all("left" in x for x in said)


@pytest.mark.parametrize("s,text", [(5, "5 s"), (59.6, "1 min 00 s"), (190, "3 min 10 s"), (3900, "1 h 05 min"),
                                    (None, "?")])
def test_duration_text(s, text):
    assert duration_text(s) == text
