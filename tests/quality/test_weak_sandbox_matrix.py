"""``specview matrix`` over a code suite runs model-written code as ``specview quality --execute`` does, so it
refuses a machine whose sandbox lacks a promised fence the same way, with the same words and the same flag
(``--allow-weak-sandbox``), and records the sandbox (with ``allowed_weak``) in the matrix's spec.

The machine without the fences is planted (tests/weak_sandbox.py); the engine is the oracle, whose reply to the
code item passes its test, so a cell that ran scores a pass in the real sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import oracle
from specview.cli import main
from specview.core.errors import SpecviewError
from specview.core.matrix import load_matrix
from specview.core.quality import load_suite
from specview.core.quality.execute import SandboxError, refuse_weak, sandbox_record, sandbox_report
from specview.core.quality.score import prompt_for
from specview.core.registry import register_backend, unregister_backend
from weak_sandbox import plant_weak

ENGINE = "oracle-weak-matrix"


@pytest.fixture()
def code_suite(tmp_path: Path):
    """A one-item code suite and an oracle engine (of model folders: no file to find) whose reply passes it."""
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({"id": "one", "prompt": "def f():\n", "test": "assert f() == 1"}) + "\n")
    be = oracle.OracleBackend()
    be.model_kind = "folder"
    be.replies.update({prompt_for(it, True): "    return 1\n" for it in load_suite(str(p)).items})
    register_backend(ENGINE, lambda: be)
    yield p
    unregister_backend(ENGINE)


def matrix(suite: Path, out: Path, *extra: str) -> int:
    return main(["matrix", "--engine", ENGINE, "-m", "oracle/t", "-md", "oracle/d", "--n-max", "2", "--p-min", "0",
                 "--suite", str(suite), "--execute", "-o", str(out), "-q", *extra])


def refusal_words(weak) -> str:
    with pytest.raises(SandboxError) as e:
        refuse_weak(weak, False)
    return str(e.value)


def test_a_weak_sandbox_is_refused_by_the_matrix_and_allowed_with_the_flag(code_suite: Path, tmp_path: Path,
                                                                         capsys, monkeypatch) -> None:
    weak = plant_weak(monkeypatch)
    out = tmp_path / "m.json"
    assert matrix(code_suite, out) == 2
    err = capsys.readouterr().err
    assert weak.text() in err  # what the sandbox enforces, said before the refusal
    assert f"specview: error: {refusal_words(weak)}" in err  # quality's own refusal, word for word
    assert all(m in err for m in weak.missing()) and "--allow-weak-sandbox" in err
    assert not out.exists()  # refused before any cell ran or the file was written

    assert matrix(code_suite, out, "--allow-weak-sandbox") == 0
    err = capsys.readouterr().err
    assert "running model-written code without: " + "; ".join(weak.missing()) in err
    doc = load_matrix(out)  # the recorded sandbox reads back through the matrix's own checks
    assert doc["spec"]["quality"]["sandbox"] == weak.to_dict(allowed_weak=True)
    cell = doc["cells"][0]
    assert cell["status"] == "ok" and cell["quality"]["vanilla_pass"] is True  # the code ran, and passed


def test_a_full_sandbox_runs_without_the_flag_and_records_it(code_suite: Path, tmp_path: Path, monkeypatch) -> None:
    """Where nothing promised is missing (planted: the weak report with its fences all held) no flag is needed,
    and the record says it was not allowed weak."""
    weak = plant_weak(monkeypatch)
    monkeypatch.setattr(type(weak), "missing", lambda self: [])
    out = tmp_path / "m.json"
    assert matrix(code_suite, out) == 0
    rec = load_matrix(out)["spec"]["quality"]["sandbox"]
    assert rec["allowed_weak"] is False and rec["missing"] == [] and rec["gaps"] == weak.gaps()


def test_the_flag_goes_with_a_task_suite(capsys) -> None:
    assert main(["matrix", "--allow-weak-sandbox", "--dry-run"]) == 2
    assert "--allow-weak-sandbox goes with a task suite" in capsys.readouterr().err


def test_sandbox_record_is_the_refusal_and_the_record(monkeypatch) -> None:
    weak = plant_weak(monkeypatch)
    with pytest.raises(SpecviewError) as e:
        sandbox_record(False)
    assert str(e.value) == refusal_words(weak)
    assert sandbox_record(True) == weak.to_dict(allowed_weak=True)
    assert sandbox_report() is weak
