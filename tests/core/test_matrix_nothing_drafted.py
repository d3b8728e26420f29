"""Matrix cells whose speculative arm drafted nothing tested nothing: they are inconclusive in the grid's words and
colours and in the summary, which names them with the reason and leaves them out of what decides the outcome."""

from __future__ import annotations

from pathlib import Path

from test_matrix import FakeSession, spec

from specview.core.matrix import load_matrix, run_matrix, summarize
from specview.core.matrix.summary import cell_category, cell_drafted_nothing, cell_label, cell_text
from specview.core.trace import Round


class HonestDrafts(FakeSession):
    """The matrix tests' fake, with the drafts the settings allow: none for the none drafter, p_min 1 or n_max 0."""

    def run(self, cfg, **kw):
        trace = super().run(cfg, **kw)
        if cfg.spec_type == "none" or (cfg.spec_type == "draft-simple" and (cfg.p_min >= 1 or cfg.n_max == 0)):
            trace.speculative.rounds = [Round(index=i, drafted=0, accepted=0, draft_ms=0, verify_ms=1, batch_size=1,
                                              first_step=i) for i in range(len(trace.speculative.tokens))]
        return trace


def _doc(tmp_path: Path, **kw) -> dict:
    run_matrix(spec(**kw), HonestDrafts(), out=tmp_path / "m.json")
    return load_matrix(tmp_path / "m.json")


def test_cells_that_drafted_nothing_are_inconclusive(tmp_path: Path):
    cells = _doc(tmp_path)["cells"]
    blank = [c for c in cells if cell_drafted_nothing(c)]
    # 3 targets x 2 prompts: the none drafter and the two p_min 1 columns of the draft model
    assert len(blank) == 18 and all(c["identical"] and c["n_drafted"] == 0 for c in blank)
    for c in blank:
        assert cell_category(c) == "inconclusive"
        assert cell_text(c) == "inconclusive · nothing drafted" and cell_label(c) == "inconclusive (nothing drafted)"
    drafted = [c for c in cells if c["n_drafted"]]
    assert drafted and not any(cell_drafted_nothing(c) for c in drafted)
    assert {cell_category(c) for c in drafted} == {"identical", "diverged"}


def test_the_summary_names_them_and_leaves_them_out(tmp_path: Path):
    text = "\n".join(summarize(_doc(tmp_path)))
    assert text.startswith("36 cells: 12 fork, 6 identical, 18 inconclusive (nothing drafted); forks: 12 diverged")
    assert ("18 cells drafted nothing, so they tested nothing speculative and are left out below: p_min 1 is "
            "llama.cpp's zero-draft control: no draft token is ever that probable (12 cells: Q4_0); the spec type is "
            "none, so no drafter ran (6 cells).") in text
    assert "identical everywhere" not in text  # no drafter or setting that tested nothing is called identical
    # among the cells that drafted, the target alone decides: the quantized ones fork
    assert "The target alone decides the outcome: all Q8_0 and Q4_K_M cells fork; every F16 cell is identical." in text


def test_a_matrix_that_drafted_nothing_says_so(tmp_path: Path):
    text = "\n".join(summarize(_doc(tmp_path, drafters=["none"])))
    assert text.startswith("6 cells: 0 fork, 0 identical, 6 inconclusive (nothing drafted).")
    assert "No cell drafted a token, so this matrix tested nothing speculative" in text
    assert "Every cell is identical" not in text


def test_an_engine_without_rounds_is_not_taken_for_one_that_drafted_nothing():
    # llama-server without per-round data: n_drafted 0 is all a cell has, which is no evidence of nothing drafted
    cell = {"status": "ok", "identical": True, "n_drafted": 0, "mean_accepted": None,
            "config": {"spec_type": "draft-simple", "n_max": 3, "p_min": 0.0}}
    assert not cell_drafted_nothing(cell) and cell_category(cell) == "identical"
    assert cell_drafted_nothing(dict(cell, config={"spec_type": "none"}))  # none drafts nothing whatever is reported


def test_each_reason_counts_its_own_cells(tmp_path: Path):
    # the cells with n_max 0 and p_min 1 count once, under the first reason that stops drafting: n_max 0
    text = "\n".join(summarize(_doc(tmp_path, targets=["demo:F16"], n_max=[0, 4])))
    assert ("8 cells drafted nothing, so they tested nothing speculative and are left out below: n_max 0 allows no "
            "draft token (4 cells: Q4_0); p_min 1 is llama.cpp's zero-draft control: no draft token is ever that "
            "probable (2 cells: Q4_0); the spec type is none, so no drafter ran (2 cells).") in text
    assert "Every cell that drafted is identical" in text  # the F16 target forks nowhere it drafted


def test_the_reports_and_the_cli_grid_say_inconclusive_too(tmp_path: Path, capsys):
    """Every front end takes a cell's words from the matrix summary: the Markdown and HTML reports' grids and
    colours, and the grid the CLI prints, never "identical" for a cell that drafted nothing."""
    from specview.commands.matrix import format_grid
    from specview.core.report.facts import cell_colour
    from specview.core.report.html import matrix_html
    from specview.core.report.markdown import matrix_markdown
    from specview.core.verdicts import COLOURS

    doc = _doc(tmp_path, drafters=["demo:Q4_0", "none"])
    blank = [c for c in doc["cells"] if cell_drafted_nothing(c)]
    assert blank and all(cell_colour(c) == COLOURS["inconclusive"] for c in blank)
    md, page = matrix_markdown(doc), matrix_html(doc)
    assert md.count("inconclusive · nothing drafted") >= len(blank) // 2
    assert "inconclusive · nothing drafted" in page
    assert format_grid(doc).count("inconclusive: nothing drafted") == len(blank)
