"""How long long work has left: progress lines with an estimate, for slow backends.

On a slow backend (Mesa's lavapipe, a CPU rasteriser: about 1.8 s per 9-token
pass, and minutes for the first pass of each new shape while its shader
pipeline compiles) the kernel map, the backend check and the prescription run
for many minutes.  :class:`WorkEta` turns "one more unit done" into a line at
most every few seconds: what is being done, how much is left and an estimate of
when it ends.  Units of different kinds (passes of different widths) keep their
own mean cost, so a wide pass does not make the narrow ones look slow.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Mapping

#: seconds between two progress lines of the same work
EVERY = 10.0
#: a kind's first unit that took this long gets a line of its own (a shader pipeline compiling, a model loading)
SLOW_FIRST = 2.0


def duration_text(seconds: float | None) -> str:
    """``45 s``, ``3 min 10 s``, ``1 h 05 min``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class WorkEta:
    """Units of work by kind (a width, a prompt), each kind with its own count to do and its own mean cost.

    ``todo`` maps each kind to how many of its units there are. :meth:`done`
    records one finished unit and returns a progress line when one is due (the
    first unit of each kind, then at most every ``every`` seconds, and the last
    unit), else None.
    """

    def __init__(self, todo: Mapping[Hashable, int], *, label: str, unit: str = "passes",
                 every: float = EVERY, clock: Callable[[], float] = time.monotonic):
        self.todo = {k: int(n) for k, n in todo.items() if n > 0}
        self.label = label
        self.unit = unit
        self.every = every
        self.clock = clock
        self.count = {k: 0 for k in self.todo}
        self.spent = {k: 0.0 for k in self.todo}
        self.t0 = self.last = clock()
        self._mark = self.t0
        self._said = self.t0

    @property
    def total(self) -> int:
        return sum(self.todo.values())

    @property
    def finished(self) -> int:
        return sum(self.count.values())

    def remaining(self) -> float | None:
        """Seconds left: each kind's units left at its own mean cost (a kind not started yet at the mean of all)."""
        n = self.finished
        if n == 0:
            return None
        overall = sum(self.spent.values()) / n
        left = 0.0
        for k, todo in self.todo.items():
            c = self.count[k]
            mean = self.spent[k] / c if c else overall
            left += max(0, todo - c) * mean
        return left

    def done(self, kind: Hashable, n: int = 1, *, what: str = "") -> str | None:
        now = self.clock()
        took = now - self._mark
        self._mark = now
        if kind not in self.todo:
            self.todo[kind] = n
            self.count[kind] = 0
            self.spent[kind] = 0.0
        first = self.count[kind] == 0 and took >= SLOW_FIRST
        self.count[kind] += n
        self.spent[kind] += took
        last = self.finished >= self.total
        if not (first or last or now - self._said >= self.every):
            return None
        self._said = now
        return self.line(kind, took if first and n == 1 else None, what=what)

    def line(self, kind: Hashable, first_took: float | None = None, *, what: str = "") -> str:
        left = self.remaining()
        head = f"{self.label}: {self.finished}/{self.total} {self.unit}"
        if what:
            head += f" ({what})"
        bits = []
        if first_took is not None:
            bits.append(f"its first took {duration_text(first_took)}")
        if self.finished >= self.total:
            bits.append(f"done in {duration_text(self.clock() - self.t0)}")
        else:
            bits.append(f"about {duration_text(left)} left")
        return f"{head}, {', '.join(bits)}"
