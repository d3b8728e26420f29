"""The app runs a suite's model-written code only in a sandbox that holds what docs/quality-sandbox.md promises,
or with the user's say-so: the Quality tab's confirmation names each missing fence and keeps its Yes disabled
until "run without these fences" is ticked; a run asked for without that tick is refused with the words of
``specview quality``'s refusal; and the Matrix tab refuses a matrix that runs code alike.  A run allowed weak
records the sandbox with ``allowed_weak``, as ``--allow-weak-sandbox`` does.

The machine without the fences is planted (tests/weak_sandbox.py).  The engine answers the one code item with
the text tests/answers.py gives every item, which is no Python: its program fails in the real sandbox, which
says the code ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from answers import AnswerRunner
from specview.core.matrix import MatrixSpec, load_matrix
from specview.core.matrix.quality import suite_block, task_prompts
from specview.core.quality import QualityResult, load_suite
from specview.core.quality.execute import SandboxError, refuse_weak
from specview.core.registry import Backend, register_backend, unregister_backend
from specview.gui.quality import ExecuteConfirm
from specview.gui.quality.confirm import ALLOW_WEAK
from weak_sandbox import plant_weak

ENGINE = "weak-sandbox-gui-fake"
TIMEOUT = 60_000


def code_file(tmp_path: Path) -> Path:
    f = tmp_path / "code.jsonl"
    f.write_text(json.dumps({"id": "add", "prompt": "def add(a, b):\n", "entry_point": "add",
                             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}) + "\n")
    return f


class CodeBackend(Backend):
    name = ENGINE
    label = "Weak sandbox test engine"
    model_kind = "gguf"
    in_process = False
    suite_file: Path | None = None
    runners: list[AnswerRunner] = []

    def runner(self, *, progress=None):
        r = AnswerRunner(load_suite(str(CodeBackend.suite_file)), ())
        CodeBackend.runners.append(r)
        return r


@pytest.fixture
def engine(tmp_path: Path):
    CodeBackend.suite_file, CodeBackend.runners = code_file(tmp_path), []
    register_backend(ENGINE, CodeBackend)
    yield CodeBackend.suite_file
    unregister_backend(ENGINE)


def calls() -> list:
    return [c for r in CodeBackend.runners for c in r.calls]


def window(make_window):
    w = make_window()
    w.set_controls(backend=ENGINE, target="demo:Q8_0", draft="demo:Q4_0", n_max=3, max_tokens=32)
    assert w.engine_problem is None
    return w


def refusal(weak) -> str:
    with pytest.raises(SandboxError) as e:
        refuse_weak(weak, False)
    return str(e.value)


def test_the_confirmation_names_what_is_missing_and_yes_waits_for_the_tick(qapp, tmp_path: Path, monkeypatch):
    weak = plant_weak(monkeypatch)
    dlg = ExecuteConfirm(load_suite(str(code_file(tmp_path))))
    info = dlg.informativeText()
    assert dlg.missing == weak.missing()
    assert all(m in info or m.replace("'", "&#x27;") in info for m in weak.missing())
    yes = dlg.button(QMessageBox.StandardButton.Yes)
    assert dlg.weak is not None and dlg.checkBox() is dlg.weak and dlg.weak.text() == ALLOW_WEAK
    assert not yes.isEnabled() and not dlg.allow_weak
    dlg.weak.setChecked(True)
    assert yes.isEnabled() and dlg.allow_weak
    dlg.weak.setChecked(False)
    assert not yes.isEnabled()


def test_a_full_sandbox_asks_no_tick(qapp, tmp_path: Path, monkeypatch):
    weak = plant_weak(monkeypatch)
    monkeypatch.setattr(type(weak), "missing", lambda self: [])
    dlg = ExecuteConfirm(load_suite(str(code_file(tmp_path))))
    assert dlg.weak is None and dlg.checkBox() is None and not dlg.allow_weak
    assert dlg.button(QMessageBox.StandardButton.Yes).isEnabled()
    assert "lacks what" not in dlg.informativeText()


def test_a_weak_sandbox_is_refused_by_the_quality_tab_unless_ticked(engine, make_window, qtbot, tmp_path: Path,
                                                                   monkeypatch):
    weak = plant_weak(monkeypatch)
    w = window(make_window)
    tab = w.quality_tab
    suite = load_suite(str(engine))
    # asked for without the tick (a caller's execute=True): nothing runs, the error is quality's refusal
    errors: list[str] = []
    tab.sigError.connect(lambda msg, _details: errors.append(msg))
    assert tab.start(suite, execute=True, out_dir=tmp_path / "refused") is None
    assert len(errors) == 1 and refusal(weak) in errors[0] and ALLOW_WEAK in errors[0]
    assert calls() == [] and tab.request is None and not (tmp_path / "refused").exists() and not w.busy
    assert "Error" in w.verdict.text()

    # the confirmation answered Yes with the tick: it runs, and records that it was allowed weak
    def tick_and_yes(dlg):
        assert not dlg.button(QMessageBox.StandardButton.Yes).isEnabled()
        dlg.weak.setChecked(True)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(ExecuteConfirm, "exec", tick_and_yes)
    with qtbot.waitSignal(tab.sigFinished, timeout=TIMEOUT) as blk:
        assert tab.start(suite, out_dir=tmp_path / "q") is not None
    res = blk.args[0].result
    assert res is not None and res.status == "complete" and len(calls()) == 1
    saved = QualityResult.load(tmp_path / "q" / "quality.json")
    assert saved.sandbox == weak.to_dict(allowed_weak=True)
    assert saved.items[0].vanilla.why.startswith("failed: ")  # the program ran in the sandbox (and is no Python)


def test_a_weak_sandbox_is_refused_by_the_matrix_tab_unless_allowed(engine, make_window, qtbot, tmp_path: Path,
                                                                  monkeypatch):
    weak = plant_weak(monkeypatch)
    w = window(make_window)
    suite = load_suite(str(engine))
    spec = MatrixSpec(targets=["demo:Q8_0"], drafters=["demo:Q4_0"], n_max=[3], p_min=[0.0], flash_attn=["auto"],
                      prompts=task_prompts(suite), max_tokens=32, diagnose=False, backend=ENGINE,
                      quality=suite_block(str(engine), execute=True))
    errors: list[str] = []
    w.matrix_tab.sigError.connect(lambda msg, _details: errors.append(msg))
    assert w.run_matrix(spec, out_dir=tmp_path / "refused") is None  # the window's own path: never allowed weak
    assert errors == [refusal(weak)] and calls() == [] and not (tmp_path / "refused").exists()
    with qtbot.waitSignal(w.matrix_tab.sigFinished, timeout=TIMEOUT):
        assert w.matrix_tab.start(spec, w.host, out_dir=tmp_path / "m", allow_weak=True) is not None
    doc = load_matrix(tmp_path / "m" / "matrix.json")
    assert doc["spec"]["quality"]["sandbox"] == weak.to_dict(allowed_weak=True)
    assert len(calls()) == 1 and doc["cells"][0]["quality"]["vanilla_why"].startswith("failed: ")
