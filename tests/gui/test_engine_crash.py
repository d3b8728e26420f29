"""The app outlives its engine: a worker killed by SIGSEGV mid-run leaves a live window that says so.

The run streams on the real llama.cpp engine (tiny GGUF models, through the
planted engine of ``tests/plants_worker.py``, which makes each forward pass of
the crashing run 50 ms longer: its 400 vanilla tokens take 20 s on any CPU,
where a tiny model's take milliseconds on a fast one, and the run would end
before the window saw its tokens), and the worker process is sent SIGSEGV
from outside once the window has its 30th vanilla token, exactly what a crash
in llama.cpp or a GPU driver looks like to the app.  The
window must stay, say SIGSEGV in the verdict bar with a one-click retry, keep
the last finished run and the settings on screen, keep the crashed run for a
trace, and run again on a fresh worker.
"""

from __future__ import annotations

import os
import signal

import pytest

from specview.core.trace import Trace
from specview.core.worker import live_workers

TIMEOUT = 300_000


@pytest.fixture
def gate(tmp_path, monkeypatch):
    """The file whose existence arms the plant: from then on each of the worker's forward passes takes 50 ms more."""
    import plants_worker

    from specview.core.registry import register_backend, unregister_backend

    path = tmp_path / "gate"
    monkeypatch.setenv("SPECVIEW_PLANT", "slow:0:1")
    monkeypatch.setenv("SPECVIEW_PLANT_GATE", str(path))
    register_backend(plants_worker.NAME, plants_worker.PATH)
    yield path
    unregister_backend(plants_worker.NAME)


@pytest.fixture
def win(qapp, tiny_target, tiny_draft, gate):
    import plants_worker

    from specview.gui.window import MainWindow

    w = MainWindow(settings_path=None, preload=False)
    w.auto_run.setChecked(False)
    w.diagnose.setChecked(False)
    w.set_controls(backend=plants_worker.NAME, target=str(tiny_target), draft=str(tiny_draft), max_tokens=40,
                   prompt="the cat sat", chat=False, ignore_eos=True, n_max=3)
    w.show()
    yield w
    assert w.shutdown(), "the model worker thread did not stop"
    w.close()
    assert live_workers() == []


def test_a_sigsegv_in_the_worker_mid_run_leaves_a_live_window(qtbot, win, gate, tmp_path):
    with qtbot.waitSignal(win.sigTraceShown, timeout=TIMEOUT) as first:
        win.run()
    good: Trace = first.args[0]
    assert good.vanilla.tokens
    pid = win.host.worker.runner.pid
    assert pid is not None and pid != os.getpid()

    win.set_controls(max_tokens=400)
    gate.touch()  # the run below takes 20 s of vanilla passes: the signal lands in its vanilla arm
    killed = []

    def on_step(ev):
        if ev.arm == "vanilla" and ev.step.index == 30 and not killed:
            killed.append(pid)
            os.kill(pid, signal.SIGSEGV)

    win.host.worker.sigStep.connect(on_step)
    with qtbot.waitSignal(win.sigError, timeout=TIMEOUT) as err:
        win.run(reuse_vanilla=False)
    win.host.worker.sigStep.disconnect(on_step)
    assert killed
    assert "SIGSEGV" in err.args[0]
    assert win.isVisible()
    bar = win.verdict.text()
    assert "The engine crashed" in bar and "SIGSEGV" in bar and "Run again" in bar
    assert win.trace is good, "the last finished run stays on screen"
    assert win.build_config().max_tokens == 400, "the settings stay as they were"
    # the crashed run is kept, and saves as a trace that says it crashed
    out = win.save_crash_trace(tmp_path / "crash.json")
    t = Trace.load(out)
    assert t.vanilla.stop_reason == "crashed" and 31 <= len(t.vanilla.tokens) < 400
    assert t.extra["crash"]["signal"] == "SIGSEGV"
    gate.unlink()  # the fresh worker below runs whole
    # "Run again" is one click: the settings as they are, on a fresh worker
    win.set_controls(max_tokens=40)
    with qtbot.waitSignal(win.sigTraceShown, timeout=TIMEOUT) as again:
        win.verdict.sigTry.emit({})
    assert again.args[0].vanilla.tokens == good.vanilla.tokens
    assert win.host.worker.runner.pid not in (None, pid)
