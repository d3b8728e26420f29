"""The test suite's lanes (pytest-xdist workers, ``-n auto --dist loadfile``): a lane that dies is one
failed test and the run goes on, and each lane says which test it is running.

A test that takes its lane down (a SIGSEGV inside llama.cpp, an ``abort()`` in ggml) is reported by
xdist as failed, "worker 'gw0' crashed while running 'tests/x.py::test_y'", and the lane is replaced.
With ``--dist loadfile`` xdist 3.8's scheduler (``LoadScopeScheduling``, which ``LoadFileScheduling``
extends) then strands the run: it puts back on its queue every file the dead lane ever ran, the
finished ones too, and hands them out again as empty batches that never complete, so no lane is
given more work and the controller waits forever; a replacement lane sent a single test holds it
(a lane runs a test only once it knows the next one, to know which fixtures to tear down) and waits
forever too; and the test that crashed goes back with its file, to crash the replacement lane, and
the next, until xdist's restart limit ends the run with the rest of that file never run.
``FileLanes`` below is that scheduler with the three mended; it is what ``--dist loadfile`` uses
while this plugin is registered (``tests/conftest.py``).  ``tests/contracts/test_lane_crash.py``
runs a suite with a crashing test under the project's options and checks that it ends, with the
counts right.

``$SPECVIEW_LANES_DIR`` (set by ``.ci/run``; nothing is written when it is unset): each pytest
process that runs tests (a lane, or a run without xdist) keeps a one-line file there, named
``<lane>.<pid>``, saying ``running <pid> <since> <node id>`` while a test runs and
``idle <pid> <since>`` between tests, and removes it when it ends normally.  A file left by a
process that is gone names the test that killed it.  ``.ci/run``'s deadline watchdog prints them.

The files go out costliest first (longest processing time first), by the seconds each took in a
measured run: the ``lane_costs`` ini option names that table (``tests/lane_costs.json``, written by
``scripts/lane-costs.py`` from pytest's JUnit XML); a file the table does not name counts
``PER_TEST`` seconds a test.  xdist's own order is by test count, which hands out last the few-test
files that load a model or start a server, and a file of minutes started last leaves the other
lane idle that long at the run's end.  Only the order depends on the table: a stale one makes a run
no less complete, only its end less even.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

LANES_DIR_ENV = "SPECVIEW_LANES_DIR"
COSTS_INI = "lane_costs"
PER_TEST = 0.5  # seconds a test, for a file the cost table does not name (most tests take less)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(COSTS_INI, "a JSON table of seconds per test file (scripts/lane-costs.py): costliest files run first",
                  default="")


def load_costs(config: pytest.Config) -> dict[str, float]:
    """The ``lane_costs`` table: test file (as in a node id) to seconds; empty where the option is unset."""
    name = config.getini(COSTS_INI)
    if not name:
        return {}
    path = config.rootpath / name
    try:
        seconds = json.loads(path.read_text())["seconds"]
        costs = {str(f): float(s) for f, s in seconds.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise pytest.UsageError(
            f"{path} (the {COSTS_INI} ini option) is not a table of seconds per test file "
            f"({type(exc).__name__}: {exc}); write it again with scripts/lane-costs.py, or unset the option"
        ) from None
    return costs


def pytest_configure(config: pytest.Config) -> None:
    """A broken cost table stops the run here, before any lane starts (the scheduler reads it only once the lanes
    have started and collected, and their shutdown then cost seconds more)."""
    if getattr(config, "workerinput", None) is None and config.getoption("dist", default=None) == "loadfile":
        load_costs(config)


# -- scheduling ------------------------------------------------------------------------------------


def _file_lanes_class():
    from xdist.scheduler import LoadFileScheduling

    class FileLanes(LoadFileScheduling):
        """``--dist loadfile`` (one test file to one lane, so its module fixtures are set up once)
        that survives a lane's death and hands out the costliest file first."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.costs = load_costs(config)

        def cost(self, scope: str) -> float:
            return self.costs.get(scope, PER_TEST * len(self.workqueue[scope]))

        def _assign_work_unit(self, node):
            # the next file a lane gets is the costliest still waiting, wherever the queue has it
            # (xdist's order, or a file a dead lane gave back); ties keep the queue's order
            heaviest = max(self.workqueue, key=self.cost)
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            crashitem = next((nid for unit in workload.values() for nid, done in unit.items() if not done), None)
            if crashitem is None:  # a lane that ended with nothing left to run
                return None
            # xdist reports this test as failed ("crashed while running"); running it again would
            # only take the replacement lane down with it
            for unit in workload.values():
                if crashitem in unit:
                    unit[crashitem] = True
            # only the tests the dead lane had not run go back, and only files with one left
            for scope, unit in workload.items():
                if not all(unit.values()):
                    self.workqueue[scope] = unit
            for other in self.nodes:
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node):
            if node.shutting_down:
                return
            if node not in self.registered_collections:
                # a replacement lane whose collection differed (xdist has reported it): no work for it
                node.shutdown()
                return
            if self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
                # a lane holds its last test until it is sent another or told to stop: never leave
                # it one test and nothing more while files are still waiting
                while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                    self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    return FileLanes


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown where xdist is not installed
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    return _file_lanes_class()(config, log)


# -- what each lane is running ---------------------------------------------------------------------

_lane_file: Path | None = None


def _write(line: str) -> None:
    if _lane_file is None:
        return
    try:
        tmp = _lane_file.with_name(_lane_file.name + ".tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, _lane_file)  # the watchdog never reads half a line
    except OSError:
        pass  # a report for the watchdog must never fail a test


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _lane_file
    folder = os.environ.get(LANES_DIR_ENV)
    config = session.config
    if not folder:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        lane = workerinput["workerid"]
    elif config.pluginmanager.has_plugin("dsession"):
        return  # xdist's controller runs no test; its lanes report
    else:
        lane = "main"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    _lane_file = Path(folder) / f"{lane}.{os.getpid()}"
    _write(f"idle {os.getpid()} {time.time():.0f}")


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _write(f"running {os.getpid()} {time.time():.0f} {nodeid}")


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    _write(f"idle {os.getpid()} {time.time():.0f}")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _lane_file
    if _lane_file is not None:
        try:
            _lane_file.unlink()
        except OSError:
            pass
        _lane_file = None
