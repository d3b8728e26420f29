"""`specview matrix` and `specview report` end to end on tiny llama.cpp models written by the tests.

Real llama.cpp, models of a few hundred tokens: fast enough to run the whole command, raw-token prompt
included, and to check what it writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tinymodel import write_tiny_llama  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from test_report import check_html, check_markdown, check_png  # noqa: E402

from specview import cli  # noqa: E402
from specview.core.matrix import load_matrix  # noqa: E402
from specview.core.trace import Trace  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {
        "a": write_tiny_llama(d / "target-a.gguf", seed=0),
        "b": write_tiny_llama(d / "target-b.gguf", seed=3),
        "draft": write_tiny_llama(d / "draft.gguf", seed=0, noise=0.3),
    }


def test_matrix_command_on_tiny_models(models, tmp_path: Path, capsys):
    toml = tmp_path / "m.toml"
    toml.write_text(
        f'targets = ["{models["a"]}", "{models["b"]}"]\n'
        f'drafters = ["{models["draft"]}", "ngram-simple", "none"]\n'
        "n_max = [1, 3]\np_min = [0.0]\nmax_tokens = 24\nignore_eos = true\nchat = false\n"
        'prompts = ["the cat sat on the", {name = "raw", tokens = [1, 270, 280, 290]}]\n'
        "[engine]\nthreads = 1\n", encoding="utf-8")
    out = tmp_path / "m.json"
    rc = cli.main(["matrix", "--config", str(toml), "-o", str(out), "--traces", str(tmp_path / "traces")])
    captured = capsys.readouterr()
    assert rc in (0, 1), captured.err
    doc = load_matrix(out)
    # per target and prompt: the draft at n_max 1 and 3, ngram-simple, none
    assert doc["status"] == "complete" and len(doc["cells"]) == doc["n_cells"] == 2 * 2 * 4
    assert all(c["status"] == "ok" for c in doc["cells"]), [c.get("error") for c in doc["cells"]]
    assert doc["counters"] == {"loads": 3, "vanilla_runs": 4, "speculative_runs": 16}
    assert rc == (1 if any(not c["identical"] for c in doc["cells"]) else 0)
    raw = [c for c in doc["cells"] if c["params"]["prompt"] == "raw"]
    for c in raw:
        t = Trace.load(tmp_path / "traces" / Path(c["trace"]).name)
        assert t.prompt["tokens"] == [1, 270, 280, 290] and t.prompt["raw_tokens"]
        assert len(t.vanilla.tokens) == 24
    for c in doc["cells"]:
        if c["params"]["drafter"] == "none":
            assert c["identical"] and c["n_drafted"] == 0
    assert "matrix: 16 of 16 cells; 3 model loads, 4 vanilla runs, 16 speculative runs" in captured.out
    assert "[16/16]" in captured.err and "ETA" in captured.err

    rep = tmp_path / "rep"
    assert cli.main(["report", str(out), "-o", str(rep)]) == 0
    page = (rep / "report.html").read_text(encoding="utf-8")
    check_html(page, bold=0)
    check_markdown((rep / "report.md").read_text(encoding="utf-8"))
    # with saved traces, the earliest fork comes with the llama.cpp commands that reproduce it
    assert ("Reproduce the earliest fork" in page) == (rc == 1)

    trace_file = tmp_path / "traces" / Path(doc["cells"][0]["trace"]).name
    assert cli.main(["report", str(trace_file), "-o", str(tmp_path / "trep")]) == 0
    page = (tmp_path / "trep" / "report.html").read_text(encoding="utf-8")
    c = check_html(page)
    assert len(c.imgs) == 2
    for png in sorted((tmp_path / "trep").glob("*.png")):
        assert check_png(png.read_bytes())[0] >= 600
    assert "--spec-draft-n-max" in page and str(models["draft"]) in page
