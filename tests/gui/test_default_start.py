"""The app as ``specview gui`` starts it: the default settings and ``preload=True``.

The models of the default run load on the worker before the first Run, and the first run then
loads nothing more.
"""

from __future__ import annotations

import pytest

from specview.core.config import RunConfig

pytestmark = pytest.mark.demo

TIMEOUT = 600_000


def test_the_default_start_preloads_the_demo_models_and_the_first_run_loads_nothing_more(make_window, qtbot,
                                                                                        demo_paths):
    w = make_window(settings_path=None, preload=True)
    assert w.pending_preload is not None and w.busy, "the default start did not ask the worker to load the models"
    cfg = w.build_config()
    # the demo target this machine picks (Q4_K_M where its repacked kernels can fork, BF16 with no repack ...),
    # known already from the same door the app asks
    from specview.core.registry import Runner

    picked = Runner.resolve(RunConfig(prompt="x"), default_target=True, measure=False).config.target
    assert (cfg.backend, cfg.target, cfg.draft) == ("llama.cpp", picked, "demo:Q4_0") and picked.startswith("demo:")
    qtbot.waitUntil(lambda: w.pending_preload is None, timeout=TIMEOUT)
    assert not w.busy and w.last_error is None, w.last_error
    runner = w.host.worker.runners[cfg.backend]  # made by the preload (the worker is idle now)
    assert runner.loads == 2  # the target and the draft
    finished = []
    w.host.worker.sigFinished.connect(finished.append)
    w.set_controls(max_tokens=8)
    with qtbot.waitSignal(w.sigTraceShown, timeout=TIMEOUT):
        w.run()
    assert len(finished) == 1 and finished[0].loads == 2, finished  # nothing loaded again
    assert len(finished[0].trace.vanilla.tokens) == 8 and w.last_error is None
