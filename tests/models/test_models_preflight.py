"""Check before load: what a run's headers can say against its drafter is said before any model loads, in the CLI,
the matrix and the app alike, naming each model as the user typed it; ``--spec-type`` is checked, and
``--drafters-for`` says why nothing fits for each spec type."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specview.cli import main
from specview.core import models as M
from stores import build_stores, header_gguf, tiny_gguf
from tinymodel import vocab_tokens

N_VOCAB = len(vocab_tokens()[0])


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """The usual stores, plus an LM Studio repository of another vocabulary (2,000 tokens more), a model with MTP
    heads and an EAGLE-3 head made for another target."""
    s = build_stores(tmp_path_factory.mktemp("pre"))
    lm = s.home / ".lmstudio" / "models"
    s.expected["lmstudio:x/OtherVocab"] = header_gguf(lm / "x" / "OtherVocab" / "other.gguf", "llama", pad=2000,
                                                      tensors={"a.weight": (8, 8)})
    s.expected["lmstudio:x/Eagle"] = header_gguf(
        lm / "x" / "Eagle" / "eagle.gguf", "eagle3", meta={"eagle3.target_hidden_size": 128,
                                                           "general.base_model.0.name": "Big-8B"},
        tensors={"fc.weight": (128, 384)})
    s.expected["lmstudio:x/Projector"] = header_gguf(lm / "x" / "Projector" / "proj.gguf", "clip")
    return s


@pytest.fixture
def here(home, monkeypatch):
    for k, v in home.env().items():
        monkeypatch.setenv(k, v)
    for k in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    from specview.core.models import names

    monkeypatch.setattr(names, "_last", [])
    return home


def cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a run gets as far as resolving its settings (the step before an engine starts)."""
    from specview.core.registry import Runner

    def refuse(*a, **k):
        raise AssertionError("the run went on to load its models")

    monkeypatch.setattr(Runner, "resolve", staticmethod(refuse))


def test_run_refuses_a_draft_of_another_vocabulary_by_its_name_before_loading(here, capsys, nothing_loads):
    pytest.importorskip("llama_cpp")
    code, _out, err = cli(capsys, "run", "-m", "ollama:tiny:8b", "-md", "lmstudio:x/OtherVocab", "-q")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "lmstudio:x/OtherVocab cannot draft for ollama:tiny:8b" in line
    assert f"{N_VOCAB + 2000} tokens against the target's {N_VOCAB}" in line
    assert str(here.expected["lmstudio:x/OtherVocab"]) not in err and "sha256-" not in err


def test_run_refuses_a_file_that_is_not_a_model_before_loading(here, capsys, nothing_loads, tmp_path):
    pytest.importorskip("llama_cpp")
    proj = str(here.expected["lmstudio:x/Projector"])
    code, _out, err = cli(capsys, "run", "-m", "ollama:tiny:8b", "-md", proj, "-q")
    assert code == 2 and "multimodal projector" in err and "; the draft is refused before anything loads" in err
    pipe = tmp_path / "pipe.gguf"
    os.mkfifo(pipe)
    code, _out, err = cli(capsys, "run", "-m", str(pipe), "--spec-type", "ngram-simple", "-q")
    assert code == 2 and "a FIFO" in err


def test_run_checks_the_spec_type(here, capsys):
    pytest.importorskip("llama_cpp")
    code, _out, err = cli(capsys, "run", "-m", "ollama:tiny:8b", "--spec-type", "bogus", "-q")
    assert code == 2 and "bogus" in err and "draft-simple" in err and "ngram-simple" in err


def test_the_headers_answer_each_spec_types_need(here):
    from specview.core.models.preflight import refusal

    scan = M.scan(cache=False)
    target, plain = "ollama:tiny:8b", "hf:tinyorg/Tiny-Draft-GGUF"
    assert refusal(target, plain, "draft-simple", "gguf", scan=scan) is None
    why = refusal(target, plain, "draft-eagle3", "gguf", scan=scan)
    assert why.startswith(f"{plain} is a model, not a drafter head") and "EAGLE-3 head" in why
    why = refusal(target, "lmstudio:x/Eagle", "draft-eagle3", "gguf", scan=scan)
    assert "lmstudio:x/Eagle" in why and "Big-8B" in why and "128 wide" in why
    why = refusal(target, None, "draft-mtp", "gguf", scan=scan)
    assert why.startswith("ollama:tiny:8b has no MTP heads")
    assert refusal(target, None, "ngram-simple", "gguf", scan=scan) is None
    # by path: named by the path as given
    other = str(here.expected["lmstudio:x/OtherVocab"])
    assert refusal(target, other, "draft-simple", "gguf", scan=scan).startswith(f"{other} cannot draft for")


def test_the_matrix_refuses_a_pair_before_any_cell(here):
    from specview.core.matrix import MatrixSpec, PromptSpec
    from specview.core.matrix.spec import MatrixError

    spec = MatrixSpec(targets=["ollama:tiny:8b"], drafters=["hf:tinyorg/Tiny-Draft-GGUF", "lmstudio:x/OtherVocab"],
                      n_max=[1], prompts=[PromptSpec(name="raw", tokens=(1, 2, 3), chat=False)], max_tokens=4)
    with pytest.raises(MatrixError, match=r"drafter lmstudio:x/OtherVocab with target ollama:tiny:8b: "
                                          r"lmstudio:x/OtherVocab cannot draft for ollama:tiny:8b"):
        spec.validate()
    ok = MatrixSpec(targets=["ollama:tiny:8b"], drafters=["hf:tinyorg/Tiny-Draft-GGUF", "ngram-simple"],
                    n_max=[1], prompts=[PromptSpec(name="raw", tokens=(1, 2, 3), chat=False)], max_tokens=4)
    ok.validate()


def test_the_apps_catalog_refuses_the_same_pairs(here):
    pytest.importorskip("PySide6")
    from specview.gui.models.catalog import Catalog

    c = Catalog()
    c.set_scan(M.scan(cache=False))
    why = c.refusal("ollama:tiny:8b", "lmstudio:x/OtherVocab", "draft-simple", "gguf")
    assert why and f"{N_VOCAB + 2000} tokens" in why
    assert c.refusal("ollama:tiny:8b", "hf:tinyorg/Tiny-Draft-GGUF", "draft-simple", "gguf") is None
    assert c.spec_refusal("ollama:tiny:8b", "draft-mtp", "gguf").startswith("ollama:tiny:8b has no MTP heads")
    assert c.spec_refusal("ollama:tiny:8b", "ngram-simple", "gguf") is None


def test_models_checks_the_spec_type(here, capsys):
    code, _out, err = cli(capsys, "models", "--drafters-for", "ollama:tiny", "--spec-type", "bogus")
    assert code == 2 and "--spec-type bogus" in err and "draft-eagle3" in err and "ngram-mod" in err


def test_drafters_for_says_why_nothing_fits_each_spec_type(here, capsys, tmp_path):
    code, out, err = cli(capsys, "models", "--drafters-for", "ollama:tiny", "--spec-type", "draft-eagle3")
    assert code == 0, err
    why = out.strip().splitlines()[-1]
    assert "made for other targets" in why and "lmstudio:x/Eagle" in why and "vocabulary" not in why
    code, out, _ = cli(capsys, "models", "--drafters-for", "ollama:tiny", "--spec-type", "draft-dflash")
    why = out.strip().splitlines()[-1]
    assert "is a DFlash head" in why and "vocabulary" not in why
    code, out, _ = cli(capsys, "models", "--drafters-for", "ollama:tiny", "--spec-type", "draft-mtp")
    assert "has no MTP heads" in out.strip().splitlines()[-1]
    # a target no model shares a vocabulary with: the vocabulary is the reason for draft-simple
    lone = tiny_gguf(tmp_path / "lone.gguf", extra="zz")
    code, out, _ = cli(capsys, "models", "--drafters-for", str(lone), "--spec-type", "draft-simple")
    assert "have another vocabulary" in out.strip().splitlines()[-1]
    assert Path(lone).exists()


def test_a_store_name_of_a_skipped_file_says_why_it_was_skipped(here):
    scan = M.scan(cache=False)
    from specview.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match=r"lmstudio:x/Projector: the scan skipped it: .*proj\.gguf: "
                                             r"a multimodal projector"):
        M.resolve_name("lmstudio:x/Projector", "gguf", scan=scan)


def test_drafters_for_gives_no_reason_when_the_spec_type_is_served(here, capsys, tmp_path):
    mtp = header_gguf(tmp_path / "mtp.gguf", "llama", meta={"llama.nextn_predict_layers": 1},
                      tensors={"a.weight": (8, 8)})
    code, out, _ = cli(capsys, "models", "--drafters-for", str(mtp), "--spec-type", "draft-mtp")
    assert code == 0 and "(none needed)" in out and "no compatible drafter" not in out
    code, out, _ = cli(capsys, "models", "--drafters-for", str(mtp), "--spec-type", "ngram-mod")
    assert code == 0 and "no compatible drafter" not in out
