"""`specview kernels` and `specview prescribe` end to end on the toy engines (no model files)."""

from __future__ import annotations

import json

import pytest

from specview.cli import main
from specview.core.kernels.map import KernelMap
from specview.core.registry import register_backend, unregister_backend
from test_prescribe import UbBackend



@pytest.fixture()
def toy():
    register_backend("prescribe-toy", UbBackend)
    yield
    unregister_backend("prescribe-toy")


def test_kernels_prints_the_table_and_heatmap_and_saves_json(toy, tmp_path, capsys):
    out = tmp_path / "k.json"
    rc = main(["kernels", "--engine", "prescribe-toy", "--targets", "dispatch:4:1.0,dispatch:9:1.0",
               "-p", "hello there", "-p", "another prompt", "--widths", "1-6", "--positions", "10",
               "-fa", "on,off", "-o", str(out), "-q"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "n_max <= 2 is proven lossless" in text and "n_max <= 5 is proven lossless" in text
    assert "dispatch:4:1.0 [fa on]" in text and "dispatch:9:1.0 [fa off]" in text
    assert "= bit-identical to single-token rows" in text
    km = KernelMap.load(out)
    assert [t.label for t in km.targets] == ["dispatch:4:1.0 [fa on]", "dispatch:4:1.0 [fa off]",
                                             "dispatch:9:1.0 [fa on]", "dispatch:9:1.0 [fa off]"]
    assert [p.name for p in km.prompts] == ["prompt1", "prompt2"] and km.positions == 10
    rc = main(["kernels", "--show", str(out)])
    assert rc == 0 and capsys.readouterr().out == text


@pytest.mark.parametrize("argv,msg", [
    (["--widths", "3-1"], "--widths"),
    (["--positions", "0"], "--positions must be >= 1"),
    (["--prompts", "no-such-prompt"], "neither a built-in prompt"),
    (["-b", "2", "--widths", "1-4"], "--n-batch: widths go up to 4"),
    (["-o", "/no/such/folder/k.json"], "does not exist"),
])
def test_kernels_errors_exit_2_and_say_why(toy, capsys, argv, msg):
    rc = main(["kernels", "--engine", "prescribe-toy", "--targets", "dispatch:4:1.0", "-p", "x", "-q", *argv])
    assert rc == 2
    assert msg in capsys.readouterr().err


def test_prescribe_from_a_saved_map(toy, tmp_path, capsys):
    k = tmp_path / "k.json"
    assert main(["kernels", "--engine", "prescribe-toy", "--targets", "dispatch:4:1.0", "-p", "hello there",
                 "--widths", "1-5", "--positions", "8", "-o", str(k), "-q"]) == 0
    capsys.readouterr()
    out = tmp_path / "p.json"
    rc = main(["prescribe", "--engine", "prescribe-toy", "--map", str(k), "--draft", "dispatch:99:0", "--n-max", "2,3",
               "-n", "8", "-o", str(out), "-q"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "The settings proven lossless here" in text and "--spec-draft-n-max 2" in text
    assert "proven by the kernel map: " in text and "prompt1 tokens 1-8" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "specview.prescription/1"
    assert any(c["kind"] == "n_max" and c["n_max"] == 2 and c["proven"] for c in doc["lossless"])


def test_prescribe_needs_a_draft_for_non_demo_targets(toy, tmp_path, capsys):
    rc = main(["prescribe", "--engine", "prescribe-toy", "--targets", "dispatch:4:1.0", "-p", "x", "--widths", "1-3",
               "--positions", "4", "-q"])
    assert rc == 2 and "--draft MODEL is needed" in capsys.readouterr().err


def test_prescribe_rejects_a_bad_suite_file_before_running(toy, tmp_path, capsys):
    bad = tmp_path / "suite.json"
    bad.write_text("{not json")
    rc = main(["prescribe", "--engine", "prescribe-toy", "--targets", "dispatch:4:1.0", "-p", "x", "--draft", "0",
               "--suite-results", str(bad), "-q"])
    assert rc == 2 and str(bad) in capsys.readouterr().err
