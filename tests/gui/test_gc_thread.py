"""Garbage is collected on the GUI thread only (specview.gui.qtcompat.MainThreadCollector).

Python collects reference cycles in whichever thread allocates when a generation fills.  A Qt object in a cycle
collected by the model worker's thread is freed in that thread; these tests plant exactly that: a cycle made
garbage on the GUI thread, then a worker thread that only allocates."""

from __future__ import annotations

import gc
import threading

import pytest
from PySide6.QtCore import QObject, Qt

from specview.gui.qtcompat import MainThreadCollector, collect_due


class _Cyclic(QObject):
    def __init__(self):
        super().__init__()
        self.me = self  # only the cyclic collector can free it


def _garbage_cycle(where: list[str]) -> None:
    """Make a Qt object in a cycle, unreachable at once; ``where`` gets the name of the thread that destroys it."""
    gc.collect()  # the new cycle is then in the youngest generation
    obj = _Cyclic()
    obj.destroyed.connect(lambda *_: where.append(threading.current_thread().name), Qt.ConnectionType.DirectConnection)


def _allocate_in_a_worker(where: list[str], rounds: int = 200) -> None:
    """A worker thread that keeps a thousand new lists alive per round: enough for the interpreter to collect its
    youngest generation in that thread several times over, if automatic collection is on."""
    def work() -> None:
        for _ in range(rounds):
            keep = [[] for _ in range(1000)]
            del keep
            if where:
                return

    t = threading.Thread(target=work, name="model-worker")
    t.start()
    t.join(30)
    assert not t.is_alive()


@pytest.fixture
def interpreter_gc():
    """The interpreter's own automatic collection, as in a process before the app starts its collector; the lane's
    collector (``conftest.py``) takes over again afterwards."""
    gc.enable()
    yield
    gc.disable()


def test_without_the_collector_a_worker_thread_frees_the_gui_threads_garbage(interpreter_gc):
    where: list[str] = []
    _garbage_cycle(where)
    _allocate_in_a_worker(where)
    assert where == ["model-worker"], where


def test_with_the_collector_the_worker_thread_frees_nothing_and_stop_collects_here(interpreter_gc):
    collector = MainThreadCollector()
    try:
        assert not gc.isenabled()
        where: list[str] = []
        _garbage_cycle(where)
        _allocate_in_a_worker(where)
        assert where == []  # the worker allocated as much as above and collected nothing
    finally:
        collector.stop()
    assert where == [threading.main_thread().name]
    assert gc.isenabled()  # on before the collector started: on again


def test_the_collectors_timer_collects_due_garbage_on_the_gui_thread(qtbot, interpreter_gc):
    collector = MainThreadCollector(interval_ms=20)
    try:
        where: list[str] = []
        _garbage_cycle(where)
        keep = [[] for _ in range(3 * gc.get_threshold()[0])]  # the youngest generation is due
        qtbot.waitUntil(lambda: bool(where), timeout=5000)
        assert where == [threading.main_thread().name]
        assert gc.get_count()[0] < len(keep)
    finally:
        collector.stop()


def test_the_lanes_tests_collect_due_garbage_at_teardown_and_stop_keeps_collection_off(_gc_on_the_gui_thread):
    assert not gc.isenabled() and _gc_on_the_gui_thread.running  # the lane's collector, from its first app test
    inner = MainThreadCollector()
    inner.stop()
    assert not gc.isenabled()  # it was off when the inner one started: still off
    where: list[str] = []
    _garbage_cycle(where)
    assert collect_due() == 0 and where == []  # nothing due yet
    keep = [[] for _ in range(3 * gc.get_threshold()[0])]
    assert collect_due() >= 1 and where == [threading.main_thread().name]
    assert gc.get_count()[0] < len(keep)
