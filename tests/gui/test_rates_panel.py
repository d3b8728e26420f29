"""The Matrix tab's Rates panel: the numbers of rates(doc) and of the planted cells, its histograms, streaming, the
one-prompt and undiagnosed cases; the Run matrix dialog's prompt suite against ``specview matrix --suite``; and
one real suite run on the demo model through the window."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QDialog

from specview.core.config import RunConfig
from specview.core.matrix import (
    MatrixRun,
    MatrixSpec,
    PromptSpec,
    expand,
    load_matrix,
    rates,
)
from specview.core.matrix.rates import gap_bin_labels
from specview.gui.matrix import MatrixDialog, MatrixView
from specview.gui.matrix.rates import NEED_PROMPTS, row_texts

Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson_by_formula(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval written out: (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


# ---------------------------------------------------------------------------
# documents with planted forks and gaps
# ---------------------------------------------------------------------------
PROMPTS = ([PromptSpec(f"m{i}", text=f"math {i}", chat=True, category="math-reasoning") for i in range(5)]
           + [PromptSpec(f"c{i}", text=f"code {i}", chat=True, category="code") for i in range(5)])
TARGETS = ("demo:Q4_K_M", "demo:Q8_0")
# Q4_K_M: 6 forks of 10, every gap diagnosed; per prompt m0..m4, c0..c4: (fork, gap, far threshold)
PLAN_A = [(3, 0.005, 2.0), (10, 0.002, 2.0), (40, 0.05, 2.0), None, (41, 0.3, 0.2),   # 0.3 > its far 0.2: material
          (100, 1.0, 2.5), (200, 5.0, 2.0), None, None, None]                         # 5.0 > 2.0: material
# Q8_0: 3 forks of 10, none diagnosed (no gap)
PLAN_B = [(20, None, None), None, None, (70, None, None), None, None, None, (150, None, None), None, None]


def cell(i: int, prompt: PromptSpec, target: str, plan) -> dict:
    fork, gap, far = plan if plan else (None, None, None)
    return {"index": i, "status": "ok", "category": prompt.category,
            "params": {"target": target, "drafter": "demo:Q4_0", "spec_type": "draft-simple", "n_max": 3,
                       "p_min": 0.0, "flash_attn": "auto", "prompt": prompt.name},
            "identical": fork is None, "first_mismatch": fork, "agree": fork, "n_vanilla": 256,
            "n_speculative": 256 if fork is None else fork + 17,
            "verdict": "identical" if fork is None else ("near-tie" if gap is not None else "diverged"),
            "diagnosed": gap is not None, "gap": gap, "far_threshold": far,
            "fork": None if fork is None else {"vanilla_token": 1, "speculative_token": 2, "vanilla_piece": " a",
                                               "speculative_piece": " b", "vanilla_margin": 0.1}}


def planted_cells() -> list[dict]:
    cells = []
    for target, plan in zip(TARGETS, (PLAN_A, PLAN_B)):
        for p, step in zip(PROMPTS, plan):
            cells.append(cell(len(cells), p, target, step))
    return cells


def empty_doc(prompts=PROMPTS) -> dict:
    spec = MatrixSpec(targets=list(TARGETS), drafters=["demo:Q4_0"], n_max=[3], prompts=list(prompts), max_tokens=256)
    return MatrixRun(spec=spec, cells=expand(spec)).to_json()


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A matrix file with the planted cells (read back through the matrix reader, so it is a valid file)."""
    doc = empty_doc()
    doc["cells"] = planted_cells()
    doc["status"] = "complete"
    out = tmp_path / "planted.json"
    out.write_text(json.dumps(doc))
    return out


def tree_rows(panel) -> list[tuple[str, list[str], list[tuple[str, list[str]]]]]:
    t = panel.tree
    out = []
    for i in range(t.topLevelItemCount()):
        it = t.topLevelItem(i)
        kids = [(it.child(j).text(0), [it.child(j).text(c) for c in range(1, t.columnCount())])
                for j in range(it.childCount())]
        out.append((it.text(0), [it.text(c) for c in range(1, t.columnCount())], kids))
    return out


def select(panel, setting: int, category: str | None = None) -> None:
    panel.select_setting(setting, category)


# ---------------------------------------------------------------------------
# the numbers
# ---------------------------------------------------------------------------
def test_the_table_shows_rates_of_the_document_and_the_planted_counts(qtbot, planted):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(planted)
    panel = view.rates_panel
    assert not panel.compact and panel.body.isVisibleTo(view)
    r = rates(load_matrix(planted))
    assert panel.rates == r  # one source of truth
    rows = tree_rows(panel)
    assert [name for name, _t, _k in rows] == ["Q4_K_M", "Q8_0"]  # what differs; the rest is said once
    assert "Q4_0 n_max=3 p_min=0" in panel.hint.text()
    for (_name, texts, kids), g in zip(rows, r["settings"]):
        assert texts == row_texts(g)
        assert kids == [(c["category"], row_texts(c)) for c in g["categories"]]
    # and the same numbers found independently from the planted cells
    (_a, a, a_kids), (_b, b, b_kids) = rows
    lo, hi = wilson_by_formula(6, 10)
    assert a[:3] == ["6 / 10", "60.0%", f"{100 * lo:.1f}%–{100 * hi:.1f}%"] == ["6 / 10", "60.0%", "31.3%–83.2%"]
    lo, hi = wilson_by_formula(3, 10)
    assert b[:3] == ["3 / 10", "30.0%", f"{100 * lo:.1f}%–{100 * hi:.1f}%"]
    # forks at 3, 10, 40, 41, 100, 200: median 40.5, quartiles (linear) 17.5 and 85.25
    assert a[3] == "40.5 (17.5–85.25)"
    assert a[4:7] == ["4", "2", "0"] and b[4:7] == ["0", "0", "3"]  # near-tie, material, undiagnosed
    assert a[7] == b[7] == "" and panel.tree.isColumnHidden(8)  # no kernel map cited: no column
    assert a[8] == b[8] == "" and panel.tree.isColumnHidden(9)  # no task suite: no answers column
    assert a_kids == [("math-reasoning", ["4 / 5", "80.0%", a_kids[0][1][2], "25 (8.25–40.25)", "3", "1", "0", "", ""]),
                      ("code", ["2 / 5", "40.0%", a_kids[1][1][2], "150 (125–175)", "1", "1", "0", "", ""])]
    lo, hi = wilson_by_formula(4, 5)
    assert a_kids[0][1][2] == f"{100 * lo:.1f}%–{100 * hi:.1f}%"
    assert [k[1][:2] for k in b_kids] == [["2 / 5", "40.0%"], ["1 / 5", "20.0%"]]


def test_the_rate_plot_draws_each_setting_with_its_wilson_interval(qtbot, planted):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(planted)
    plot = view.rates_panel.rate_plot
    assert not plot.empty and plot.labels == ["Q4_K_M", "Q8_0"]
    x, y = plot.points.getData()
    assert list(x) == pytest.approx([60.0, 30.0]) and y[0] > y[1]  # the first setting on top
    o = plot.bars.opts
    for i, k in enumerate((6, 3)):
        lo, hi = wilson_by_formula(k, 10)
        assert o["x"][i] - o["left"][i] == pytest.approx(100 * lo)
        assert o["x"][i] + o["right"][i] == pytest.approx(100 * hi)
    # the two intervals overlap (31.3%-83.2% and 10.8%-60.3%): both bars cover 40-60%
    assert o["x"][0] - o["left"][0] < o["x"][1] + o["right"][1]
    # the selected setting is ringed; a click on another row of the plot selects it in the tree
    assert list(plot.selected.getData()[0]) == pytest.approx([60.0])
    plot.sigRowClicked.emit(1)
    assert view.rates_panel.tree.currentItem().text(0) == "Q8_0"
    assert list(plot.selected.getData()[0]) == pytest.approx([30.0])
    assert view.rates_panel.severity_plot.empty  # Q8_0's forks have no gap


def test_the_severity_histogram_stacks_the_planted_gaps_per_bin(qtbot, planted):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(planted)
    panel = view.rates_panel
    select(panel, 0)
    sev = panel.severity_plot
    assert not sev.empty and not sev.hint.isVisibleTo(sev)
    # gaps 0.005, 0.002 | 0.05 | 0.3 (material) | 1.0 | 5.0 (material) in bins 0-0.01, 0.01-0.1, 0.1-0.5, 0.5-2, >= 2
    assert sev.near_counts == [2, 1, 0, 1, 0] and sev.material_counts == [0, 0, 1, 0, 1]
    assert list(sev.near.opts["height"]) == [2, 1, 0, 1, 0]
    assert list(sev.material.opts["height"]) == [0, 0, 1, 0, 1]
    assert list(sev.material.opts["y0"]) == [2, 1, 0, 1, 0]  # stacked on the near-ties
    assert [t.textItem.toPlainText() if t.isVisible() else "" for t in sev.totals] == ["2", "1", "1", "1", "1"]
    ticks = sev.getPlotItem().getAxis("bottom")._tickLevels[0]
    assert [t for _x, t in ticks] == gap_bin_labels() == ["0–0.01", "0.01–0.1", "0.1–0.5", "0.5–2", "≥ 2"]
    # fork positions 3, 10, 40, 41, 100, 200 in bins of 32 tokens (256 / 8)
    pos = panel.position_plot
    assert pos.bin_width == 32 and pos.counts == [2, 2, 0, 1, 0, 0, 1, 0]
    assert list(pos.bars.opts["height"]) == [2, 2, 0, 1, 0, 0, 1, 0] and list(pos.bars.opts["x0"])[:3] == [0, 32, 64]
    assert pos.median.value() == 40.5 and [q.value() for q in pos.quartiles] == [17.5, 85.25]
    # a category's own histogram: Q4_K_M on the code prompts forks at 100 (gap 1.0) and 200 (gap 5.0, material)
    select(panel, 0, "code")
    assert panel.tree.currentItem().text(0) == "code"
    assert sev.near_counts == [0, 0, 0, 1, 0] and sev.material_counts == [0, 0, 0, 0, 1]
    assert [t.textItem.toPlainText() if t.isVisible() else "" for t in sev.totals] == ["", "", "", "1", "1"]
    assert pos.counts == [0, 0, 0, 1, 0, 0, 1, 0]
    assert "Q4_K_M with Q4_0 n_max=3 p_min=0 · code: 2 of 5 fork" in panel.selection.text()


def test_undiagnosed_forks_show_the_hint_not_empty_axes(qtbot, planted):
    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(planted)
    view.show()
    panel = view.rates_panel
    select(panel, 1)  # Q8_0: three forks, none diagnosed
    sev = panel.severity_plot
    assert sev.empty and sev.hint.isVisible()
    assert "run with diagnosis for the gaps" in sev.hint.text()
    assert not sev.getPlotItem().getAxis("bottom").isVisible()
    assert sum(sev.near_counts) + sum(sev.material_counts) == 0
    # its positions are still drawn: forks at 20, 70 and 150
    assert not panel.position_plot.empty and panel.position_plot.counts == [1, 0, 1, 0, 1, 0, 0, 0]
    select(panel, 0)  # back to a diagnosed setting: bars, no hint
    assert not sev.empty and not sev.hint.isVisible()


def test_a_matrix_of_one_prompt_keeps_the_panel_to_one_line(qtbot):
    view = MatrixView()
    qtbot.addWidget(view)
    view.resize(1000, 800)
    doc = empty_doc(PROMPTS[:1])
    doc["cells"] = [cell(0, PROMPTS[0], TARGETS[0], PLAN_A[0]), cell(1, PROMPTS[0], TARGETS[1], None)]
    view.setMatrix(doc)
    view.show()
    qtbot.waitExposed(view)
    panel = view.rates_panel
    assert panel.compact and not panel.body.isVisible()
    assert panel.hint.text() == NEED_PROMPTS and "prompt suite" in panel.hint.text()
    assert panel.height() < 90 and view.table.height() > 400
    # the same view given a suite's matrix opens the whole panel
    doc = empty_doc()
    doc["cells"] = planted_cells()[:3]
    view.setMatrix(doc)
    assert not panel.compact and panel.body.isVisible() and panel.height() > 250


def test_streamed_cells_update_the_panel(qtbot):
    view = MatrixView()
    qtbot.addWidget(view)
    view.setMatrix(empty_doc())  # as a run starts: the planned matrix, no cell yet
    panel = view.rates_panel
    assert not panel.compact and panel.tree.topLevelItemCount() == 0 and panel.rate_plot.empty
    first_item = None
    forks = {t: 0 for t in TARGETS}
    for k, c in enumerate(planted_cells()):
        view.addCell(c)
        forks[c["params"]["target"]] += not c["identical"]
        assert panel.rates == rates(view.doc)
        rows = tree_rows(panel)
        done = [t for t in TARGETS if any(x["params"]["target"] == t for x in view.doc["cells"])]
        assert len(rows) == len(done)
        for (_n, texts, _k), t in zip(rows, done):
            n = sum(x["params"]["target"] == t for x in view.doc["cells"])
            assert texts[0] == f"{forks[t]} / {n}"
        if first_item is None:
            first_item = panel.tree.topLevelItem(0)
            assert panel.tree.currentItem() is first_item  # the first setting is selected as it appears
        assert panel.tree.topLevelItem(0) is first_item  # rows are updated in place: selection and folds stay
        x, _y = panel.rate_plot.points.getData()
        assert list(x) == pytest.approx([100 * g["rate"] for g in panel.rates["settings"]])
    assert panel.severity_plot.near_counts == [2, 1, 0, 1, 0]


def test_a_cited_kernel_map_shows_its_prediction_and_contradictions(qtbot, tmp_path):
    """Q4_K_M's cells are predicted to differ (its forks agree with that); Q8_0's to be lossless, yet three fork."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor

    from specview.core.verdicts import COLOURS

    doc = empty_doc()
    doc["cells"] = planted_cells()
    for c in doc["cells"]:
        proven = c["params"]["target"] == "demo:Q8_0"
        c["kernel_prediction"] = {"status": "proven-lossless" if proven else "kernels-differ",
                                  "target": c["params"]["target"], "n_max": 3, "widths": [1, 2, 3, 4]}
    view = MatrixView()
    qtbot.addWidget(view)
    view.setMatrix(doc)
    panel = view.rates_panel
    assert not panel.tree.isColumnHidden(8)
    a, b = (panel.tree.topLevelItem(i) for i in range(2))
    assert a.text(8) == "kernels differ: a fork is possible (10 cells)"
    assert b.text(8) == "proven lossless (10 cells); 3 CONTRADICTIONS"
    assert b.background(8).color() == QColor(COLOURS["state"]) and a.background(8).style() == Qt.BrushStyle.NoBrush
    assert "kernel map: proven lossless (10 cells); 3 CONTRADICTIONS" in b.toolTip(0)


def test_the_panel_follows_the_theme(qtbot, planted):
    from PySide6.QtGui import QPalette

    from specview.gui.theme import apply_theme

    view = MatrixView()
    qtbot.addWidget(view)
    view.loadFile(planted)
    try:
        for theme in ("dark", "light"):
            apply_theme(theme)
            pal = view.palette()
            base = pal.color(QPalette.ColorRole.Base)
            for plot in (view.rates_panel.rate_plot, view.rates_panel.severity_plot, view.rates_panel.position_plot):
                assert plot.backgroundBrush().color() == base
    finally:
        apply_theme("system")


# ---------------------------------------------------------------------------
# the dialog's prompt suite is `specview matrix --suite`
# ---------------------------------------------------------------------------
def cli_spec(*argv: str):
    from specview.commands.matrix import add_parser, spec_from_args

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return spec_from_args(p.parse_args(["matrix", *argv]))


@pytest.fixture
def cfg() -> RunConfig:
    return RunConfig(prompt="Write an essay on sleep.", target="demo:Q4_K_M", draft="demo:Q4_0", n_max=3)


def test_a_suite_from_the_dialog_is_the_cli_suite(qtbot, cfg):
    dlg = MatrixDialog(cfg, diagnose=True)
    qtbot.addWidget(dlg)
    assert not dlg.prompt_suite.isChecked() and not dlg.stop_box.isChecked()
    dlg.prompt_suite.setChecked(True)
    # the suite starts from the setting on screen, as --suite starts from the demo's
    assert dlg.chosen("targets") == ["demo:Q4_K_M"] and dlg.chosen("drafters") == ["demo:Q4_0"]
    assert dlg.chosen("n_max") == [3] and dlg.stop_box.isChecked() and dlg.stop_n.value() == 16
    cli = cli_spec("--suite", "--targets", "demo:Q4_K_M", "--drafters", "demo:Q4_0", "--n-max", "3")
    assert dlg.spec().to_json() == cli.to_json()
    assert len(dlg.spec().prompts) == 42 and dlg.spec().stop_after_fork == 16
    assert dlg.count.text().startswith("42 cells (42 prompts × 1 setting), 256 tokens per arm; cells stop 16 tokens")
    # chosen categories, another target, full texts, no diagnosis
    for cat, box in dlg.category_boxes:
        box.setChecked(cat in ("code", "math-reasoning"))
    dict(dlg.boxes["targets"])["demo:Q8_0"].setChecked(True)
    dlg.stop_box.setChecked(False)
    dlg.diagnose = False
    cli = cli_spec("--suite", "math-reasoning,code", "--targets", "demo:Q8_0,demo:Q4_K_M", "--drafters", "demo:Q4_0",
                   "--n-max", "3", "--full-text", "--no-diagnose")
    got = dlg.spec()
    assert got.to_json() == cli.to_json() and got.stop_after_fork is None
    assert {p.category for p in got.prompts} == {"code", "math-reasoning"} and len(expand(got)) == 24
    dlg.stop_box.setChecked(True)
    dlg.stop_n.setValue(5)
    assert dlg.spec().to_json() == cli_spec("--suite", "math-reasoning,code", "--targets", "demo:Q8_0,demo:Q4_K_M",
                                            "--drafters", "demo:Q4_0", "--n-max", "3", "--stop-after-fork", "5",
                                            "--no-diagnose").to_json()
    # no category: nothing to run
    for _cat, box in dlg.category_boxes:
        box.setChecked(False)
    assert "at least one suite category" in dlg.count.text() and not dlg.buttons.button(
        dlg.buttons.StandardButton.Ok).isEnabled()
    # back to the current prompt: its own matrix, full texts
    dlg.prompt_current.setChecked(True)
    spec = dlg.spec()
    assert [p.text for p in spec.prompts] == [cfg.prompt] and spec.stop_after_fork == 5  # the user's own choice stays


KERNEL_MAP = {
    "schema": "specview.kernels/1", "backend": "llama.cpp", "widths": [1, 2, 3], "positions": 16, "top_k": 8,
    "prompts": [{"name": "p", "tokens": [1, 2]}], "environment": {},
    "targets": [{"target": "demo:Q4_K_M", "settings": {"threads": 1}, "model": {}, "threads_used": 1,
                 "prompts": [{"name": "p", "prompt_tokens": [0, 1, 2], "tokens": [3], "positions": 16}],
                 "widths": [{"width": w, "rows": 16, "identical": 16, "flips": 0, "max_delta": 0.0, "p95_delta": 0.0}
                            for w in (1, 2, 3)]}]}


def test_the_kernel_map_field_cites_a_map_as_the_cli_does(qtbot, cfg, tmp_path):
    km = tmp_path / "kernels.json"
    km.write_text(json.dumps(KERNEL_MAP))
    dlg = MatrixDialog(cfg, diagnose=True)
    qtbot.addWidget(dlg)
    assert dlg.spec().kernel_map is None and "kernel_map" not in dlg.spec().to_json()
    dlg.prompt_suite.setChecked(True)
    dlg.kernel_map.setText(str(km))
    cli = cli_spec("--suite", "--targets", "demo:Q4_K_M", "--drafters", "demo:Q4_0", "--n-max", "3",
                   "--kernel-map", str(km))
    assert dlg.spec().kernel_map == str(km) and dlg.spec().to_json() == cli.to_json()
    ok = dlg.buttons.button(dlg.buttons.StandardButton.Ok)
    assert ok.isEnabled()
    dlg.kernel_map.setText(str(tmp_path / "missing.json"))  # refused as the CLI refuses it, naming the file
    assert "missing.json" in dlg.count.text() and "no such file" in dlg.count.text() and not ok.isEnabled()
    dlg.kernel_map.clear()
    assert ok.isEnabled() and dlg.spec().kernel_map is None


def test_the_current_prompt_matrix_is_unchanged(qtbot, cfg):
    dlg = MatrixDialog(cfg, diagnose=False)
    qtbot.addWidget(dlg)
    spec = dlg.spec()
    assert spec.targets == ["demo:Q8_0", "demo:Q4_K_M"] and spec.drafters == ["demo:Q4_0", "ngram-simple", "none"]
    assert spec.stop_after_fork is None and [p.text for p in spec.prompts] == [cfg.prompt]
    dlg.prompt_suite.setChecked(True)
    dlg.prompt_current.setChecked(True)  # untouched boxes come back as they were
    assert dlg.spec().to_json() == spec.to_json() and dlg.count.text() == "8 cells"


# ---------------------------------------------------------------------------
# a real suite run on the demo model, from the dialog, through the window
# ---------------------------------------------------------------------------
RUN_TIMEOUT = 900_000  # ms; the wait ends on the finished signal


def test_a_suite_run_from_the_dialog_fills_the_panel(make_window, qtbot, monkeypatch):
    cats = ("translation", "question-answering")

    def choose(dlg):  # the user picks the prompt suite and two of its categories
        dlg.prompt_suite.setChecked(True)
        for cat, box in dlg.category_boxes:
            box.setChecked(cat in cats)
        return QDialog.DialogCode.Accepted

    monkeypatch.setattr(MatrixDialog, "exec", choose)
    w = make_window()
    w.set_controls(target="demo:Q4_K_M", draft="demo:Q4_0", n_max=3, max_tokens=24, threads=1, diagnose=True)
    w.diagnose.setChecked(True)
    panel = w.matrix_view.rates_panel
    streamed = []

    def on_cell(rec):  # the panel already shows the streamed cell when the window says it arrived
        g = panel.rates["settings"][0]
        streamed.append((g["n"] + g["errors"], panel.tree.topLevelItem(0).text(1)))

    w.sigMatrixCell.connect(on_cell)
    with qtbot.waitSignal(w.sigMatrixFinished, timeout=RUN_TIMEOUT) as blk:
        w.act_matrix.trigger()
    doc = blk.args[0].doc
    path = w.matrix_view.source
    assert doc["status"] == "complete" and path is not None and path.exists()
    saved = load_matrix(path)
    n = len(saved["cells"])
    assert n == 12 and {c["category"] for c in saved["cells"]} == set(cats)
    assert saved["spec"]["stop_after_fork"] == 16 and saved["spec"]["max_tokens"] == 24
    assert [k for k, _text in streamed] == list(range(1, n + 1))
    r = rates(saved)
    assert panel.rates == r
    g = r["settings"][0]
    assert g["n"] == sum(c["status"] == "ok" for c in saved["cells"])
    assert g["forks"] == sum(c["status"] == "ok" and not c["identical"] for c in saved["cells"])
    rows = tree_rows(panel)
    assert len(rows) == 1 and rows[0][1] == row_texts(g)
    assert rows[0][2] == [(c["category"], row_texts(c)) for c in g["categories"]]
    assert [k for k, _t in rows[0][2]] == list(cats)
    assert streamed[-1][1] == f"{g['forks']} / {g['n']}"
    select(panel, 0)
    sev = panel.severity_plot
    assert sev.near_counts == [b["near-tie"] for b in g["gaps"]]
    assert sev.material_counts == [b["material"] for b in g["gaps"]]
    assert sum(sev.near_counts) + sum(sev.material_counts) == g["severity"]["near-tie"] + g["severity"]["material"]
    assert panel.position_plot.counts == g["positions"]["histogram"]
    x, _y = panel.rate_plot.points.getData()
    assert list(x) == pytest.approx([100 * g["rate"]])
    assert np.isclose(panel.rate_plot.low[0], 100 * g["low"]) and np.isclose(panel.rate_plot.high[0], 100 * g["high"])
