"""The Kernel map tab's backend check at every verify width, on a toy whose rows of passes at least 3 tokens
wide carry a planted error: the table has a row per width 1 to n_max + 1, the pair is zero at every width
(one thread and two compute the same), and the drift appears from width 3 on, as the check's result says."""

from __future__ import annotations

import pytest

from fakes import KernelToy
from specview.core.config import EngineSettings
from specview.core.diagnose.reference import WIDTH_HEADERS
from specview.core.inprocess import InProcessBackend
from specview.core.registry import register_backend, unregister_backend

TOY = "kernels-check-toy"


class ToyBackend(InProcessBackend):
    name = TOY
    label = "Toy kernels"

    def load(self, name: str, settings: EngineSettings) -> KernelToy:
        return KernelToy(name)


@pytest.fixture
def toy():
    register_backend(TOY, ToyBackend)
    yield TOY
    unregister_backend(TOY)


def test_the_check_shows_every_width_against_the_reference(toy, make_window, qtbot):
    w = make_window()
    w.set_controls(backend=TOY, target="dispatch:3:0.05", draft="dispatch:99:0", threads=2, n_max=3,
                   prompt="the cat sat on the mat")
    assert w.engine_problem is None
    panel = w.kernels_tab.check_panel
    with qtbot.waitSignal(panel.sigFinished, timeout=30000) as blk:
        assert panel.start() is not None
    r = blk.args[0]
    assert r["ok"] is True and [x["width"] for x in r["widths"]] == [1, 2, 3, 4]
    t = panel.table
    assert t.rowCount() == 4 and t.columnCount() == len(WIDTH_HEADERS)
    col = {h: j for j, h in enumerate(WIDTH_HEADERS)}
    for i, row in enumerate(r["widths"]):
        assert t.item(i, col["width"]).text() == str(row["width"])
        assert t.item(i, col["pair max |Δ|"]).text() == "0"
        drift = float(t.item(i, col["drift max |Δ|"]).text())
        assert drift == pytest.approx(row["drift"]["max_logit_delta"], rel=1e-3)
        assert (drift > 0) == (row["width"] >= 3)
    assert panel.verdict.text().startswith("<b>Sane</b>") and panel.button.isEnabled()
