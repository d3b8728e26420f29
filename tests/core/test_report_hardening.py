"""No input crashes ``report``, ``compare`` or ``matrix --resume``: files nested 100,000 levels deep (JSON and
TOML), deep values inside otherwise valid files, and values of the wrong type end in specview's own error
(exit status 2, one line naming the file), never a Python traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_matrix import FakeSession, spec
from test_report import hostile_trace

from specview import cli
from specview.core.matrix import MatrixError, load_matrix, run_matrix, validate_matrix

DEEP = 100_000


def deep_json(n: int = DEEP, inner: str = "1") -> str:
    return "[" * n + inner + "]" * n


def _machine_notices() -> list[str]:
    """The lines a command that decides the engine's settings prints on this machine before any work (``specview:
    no repack by default: ...`` where the crash probe crashed, or where $SPECVIEW_REPACK_PROBE plants that): the
    machine's decisions, not the ones each run makes for its own model (the rollback)."""
    from specview.core.config import EngineSettings
    from specview.core.config import PER_MODEL
    from specview.core.registry import Runner

    _, decisions = Runner.resolve_settings(EngineSettings(), backend="llama.cpp")
    return [f"specview: {d.why}" for d in decisions if d.setting not in PER_MODEL]


def _refused(argv: list[str], capsys, *words: str, decides: bool = False) -> str:
    """``argv`` ends in exit status 2 and one error line naming ``words``, never a traceback; ``decides``: the
    command decides this machine's settings before it reads the file, so its notices (and nothing else) come first."""
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("specview: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert lines[:-1] == (_machine_notices() if decides else []), err
    for w in words:
        assert w in errors[0], err
    return errors[0]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.json"
    hostile_trace().save(good)
    out = {"good": good}
    out["deep"] = tmp_path / "deep.json"
    out["deep"].write_text(deep_json(), encoding="utf-8")
    t = json.loads(good.read_text())
    out["deep_inside"] = tmp_path / "deep-inside.json"  # a valid trace whose environment holds a deep value
    out["deep_inside"].write_text(json.dumps(t)[:-1] + ', "extra": ' + deep_json() + "}", encoding="utf-8")
    out["deep_object"] = tmp_path / "deep-object.json"
    out["deep_object"].write_text('{"a":' * DEEP + "1" + "}" * DEEP, encoding="utf-8")
    return out


@pytest.mark.parametrize("name", ["deep", "deep_inside", "deep_object"])
def test_report_on_a_deeply_nested_file(files, name, tmp_path: Path, capsys):
    _refused(["report", str(files[name]), "-o", str(tmp_path / "r")], capsys, str(files[name]))
    assert not (tmp_path / "r" / "report.html").exists()


@pytest.mark.parametrize("name", ["deep", "deep_inside", "deep_object"])
def test_compare_with_a_deeply_nested_file(files, name, capsys):
    _refused(["compare", str(files["good"]), str(files[name])], capsys, str(files[name]))
    _refused(["compare", str(files[name]), str(files["good"])], capsys, str(files[name]))


def _matrix_argv(out: Path) -> list[str]:
    return ["matrix", "--targets", "demo:F16", "--drafters", "none", "-p", "Hi", "-n", "8", "--no-diagnose",
            "-o", str(out), "--resume"]


def test_matrix_resume_from_a_deeply_nested_file(tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    out.write_text(deep_json(), encoding="utf-8")
    _refused(_matrix_argv(out), capsys, str(out), decides=True)
    out.write_text('{"schema": "specview.matrix/1", "spec": {}, "cells": ' + deep_json() + "}", encoding="utf-8")
    _refused(_matrix_argv(out), capsys, str(out), decides=True)
    assert out.read_text(encoding="utf-8").endswith("]}")  # the file is left as it was


@pytest.mark.parametrize("text", [
    "targets = " + "[" * DEEP + "]" * DEEP,
    "targets = " + "{a = " * DEEP + "1" + "}" * DEEP,
    "x" + ".y" * DEEP + " = 1",
    "[" + "t." * DEEP + "u]\nv = 1",
])
def test_matrix_config_nested_too_deeply(tmp_path: Path, capsys, text: str):
    f = tmp_path / "deep.toml"
    f.write_text(text, encoding="utf-8")
    _refused(["matrix", "--config", str(f), "--dry-run"], capsys, str(f), "nested" if "[" * 3 in text or "{" in text
             else "dotted key")


def test_a_matrix_with_a_deep_value_inside_is_refused_by_its_validator(tmp_path: Path):
    run_matrix(spec(), FakeSession(), out=tmp_path / "m.json")
    doc = load_matrix(tmp_path / "m.json")
    v: list = []
    for _ in range(200):
        v = [v]
    doc["environment"]["x"] = v
    with pytest.raises(MatrixError, match="nested more than"):
        validate_matrix(doc, source="m.json")


@pytest.mark.parametrize("path, value, words", [
    (("cells", 0, "first_mismatch"), "twelve", "first_mismatch"),
    (("cells", 0, "gap"), [1, 2], "gap"),
    (("cells", 0, "speedup"), 10 ** 400, "speedup"),
    (("cells", 0, "params", "p_min"), "zero", "p_min"),
    (("cells", 0, "params", "target"), 5, "target"),
    (("cells", 0, "status"), "maybe", "status"),
    (("cells", 0, "fork"), {"vanilla_piece": 3}, "vanilla_piece"),
    (("cells", 0, "index"), -1, "index"),
    (("spec", "targets"), [["a"]], "targets"),
    (("spec", "n_max"), ["x"], "n_max"),
    (("spec", "prompts"), [{"name": 1, "text": "x"}], "name"),
    (("spec", "engine"), {"n_batch": "big"}, "n_batch"),
    (("spec", "max_tokens"), -5, "max_tokens"),
    (("counters",), {"loads": "many"}, "loads"),
    (("summary",), [1], "summary"),
])
def test_wrong_types_in_a_matrix_file_are_refused_naming_the_field(tmp_path: Path, capsys, path, value, words):
    run_matrix(spec(), FakeSession(), out=tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    _refused(["report", str(bad), "-o", str(tmp_path / "r")], capsys, str(bad), words)
    argv = ["matrix", "--targets", "demo:F16,demo:Q8_0,demo:Q4_K_M", "--drafters", "demo:Q4_0,ngram-simple,none",
            "--n-max", "1,4", "--p-min", "0,1", "-p", "x", "-n", "32", "-o", str(bad), "--resume", "--no-diagnose"]
    _refused(argv, capsys, words, decides=True)


def test_a_trace_with_odd_values_still_reports_or_is_refused(tmp_path: Path, capsys):
    """Free-form blocks (config, environment, models, diagnosis) may hold anything: the report shows it as text."""
    t = json.loads(hostile_trace().dumps())
    t["config"]["n_max"] = {"<b>": [1, 2, {"x": None}]}
    t["config"]["engine"] = "fast"
    t["environment"]["cpu"] = [["<script>"] * 3] * 3
    t["environment"]["big"] = 10 ** 300
    t["models"]["draft"] = "a <i>string</i>"
    t["diagnosis"]["gap"] = "large"
    t["diagnosis"]["thresholds"] = [1, 2]
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(t), encoding="utf-8")
    rc = cli.main(["report", str(f), "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc in (0, 2) and "Traceback" not in err
    if rc == 0:
        from test_report import check_html, check_markdown

        check_html((tmp_path / "r" / "report.html").read_text(encoding="utf-8"))
        check_markdown((tmp_path / "r" / "report.md").read_text(encoding="utf-8"))
        page = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
        assert "not a valid run" in page  # n_max is no number: no llama.cpp commands are made up from it


@pytest.mark.parametrize("kind", ["trace", "matrix"])
def test_a_number_of_five_thousand_digits_is_refused_or_shown(kind, tmp_path: Path, capsys):
    """Python refuses to parse integers of more than 4300 digits: that must be specview's error, not a crash."""
    if kind == "trace":
        d = json.loads(hostile_trace().dumps())
    else:
        run_matrix(spec(), FakeSession(), out=tmp_path / "m.json")
        d = json.loads((tmp_path / "m.json").read_text())
    text = json.dumps(d)[:-1] + ', "big": ' + "7" * 5000 + "}"
    f = tmp_path / "big.json"
    f.write_text(text, encoding="utf-8")
    rc = cli.main(["report", str(f), "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc in (0, 2) and "Traceback" not in err, err
