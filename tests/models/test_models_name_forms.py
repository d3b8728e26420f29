"""Names as the tools spell them: llama.cpp's ``-hf org/repo:TAG`` and ollama's ``hf.co/org/repo:TAG``, LM Studio's
``publisher/repo/file.gguf``, ollama's reading of a name without a tag (``:latest``, never another tag), and a
file reached through several stores answering to every store's name for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specview.core import models as M
from specview.core.errors import ModelFileError
from stores import _hf_file, _ollama, build_stores, tiny_gguf


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    s = build_stores(tmp_path_factory.mktemp("forms"))
    h = s.home
    ol = h / ".ollama" / "models"
    # an ollama model with one tag, not latest; and a model whose :latest and :1b are other blobs
    s.expected["ollama:llama3.2:1b"] = _ollama(ol, "llama3.2", "1b", lambda p: tiny_gguf(p, seed=11))
    s.expected["ollama:gemma:2b"] = _ollama(ol, "gemma", "2b", lambda p: tiny_gguf(p, seed=12))
    s.expected["ollama:gemma:latest"] = _ollama(ol, "gemma", "latest", lambda p: tiny_gguf(p, seed=13))
    # LM Studio entries that are links to an ollama blob (what gollama-style link tools make)
    blob = _ollama(ol, "qwen3", "8b", lambda p: tiny_gguf(p, seed=14, quant="Q4_K_M"))
    s.expected["ollama:qwen3:8b"] = blob
    link = h / ".lmstudio" / "models" / "linked" / "qwen3-8b-GGUF" / "qwen3-8b.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(blob)
    s.expected["lmstudio:linked/qwen3-8b-GGUF"] = link
    # an unsloth-style repository: dynamic quants whose header's file type is the plain one's
    hub = h / ".cache" / "huggingface" / "hub"
    repo = "unsloth/Tiny-GGUF"
    for seed, (tag, quant) in enumerate((("Q4_K_M", "Q4_K_M"), ("UD-Q4_K_XL", "Q4_K_M"), ("UD-Q2_K_XL", "Q4_0"))):
        s.expected[f"hf:{repo}:{tag}"] = _hf_file(hub, repo, f"Tiny-{tag}.gguf",
                                                  lambda p, q=quant, k=seed: tiny_gguf(p, quant=q, seed=30 + k))
    s.expected[f"hf:{repo}:BF16"] = _hf_file(hub, repo, "BF16/Tiny-BF16.gguf",
                                             lambda p: tiny_gguf(p, quant="F16", seed=20))
    return s


@pytest.fixture(scope="module")
def scan(home):
    return M.scan(home=home.home, env=home.env(), cache=False)


def _path(scan, name: str) -> Path:
    return Path(M.resolve_name(name, "gguf", scan=scan).path)


def same_file(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def test_a_file_in_two_stores_keeps_both_names(home, scan):
    blob = home.expected["ollama:qwen3:8b"]
    assert same_file(_path(scan, "ollama:qwen3:8b"), blob)
    assert same_file(_path(scan, "lmstudio:linked/qwen3-8b-GGUF"), blob)
    assert same_file(_path(scan, "lmstudio:linked/qwen3-8b-GGUF/qwen3-8b.gguf"), blob)
    listed = [m for m in scan.models if same_file(Path(m.path), blob)]
    assert len(listed) == 1  # one model, listed once, with every name
    assert {"ollama:qwen3:8b", "lmstudio:linked/qwen3-8b-GGUF"} <= {listed[0].name, *listed[0].aliases}
    assert scan.problems == []


@pytest.mark.parametrize("form", ["hf:unsloth/Tiny-GGUF:{tag}", "hf:hf.co/unsloth/Tiny-GGUF:{tag}",
                                  "hf:unsloth/Tiny-GGUF:{low}"])
@pytest.mark.parametrize("tag", ["UD-Q4_K_XL", "UD-Q2_K_XL", "Q4_K_M", "BF16"])
def test_the_hf_tag_form_picks_the_file_of_that_tag(home, scan, form, tag):
    """By the tag the file's name carries (its header says Q4_K_M for both UD-Q4_K_XL and Q4_K_M)."""
    name = form.format(tag=tag, low=tag.lower())
    assert _path(scan, name) == home.expected[f"hf:unsloth/Tiny-GGUF:{tag}"]


def test_lm_studio_path_form(home, scan):
    for name, want in (("lmstudio:tinypub/Tiny-GGUF/tiny-F32.gguf", "lmstudio:tinypub/Tiny-GGUF:F32"),
                       ("lmstudio:tinypub/Tiny-GGUF/tiny-Q8_0.gguf", "lmstudio:tinypub/Tiny-GGUF:Q8_0"),
                       ("hf:unsloth/Tiny-GGUF/BF16/Tiny-BF16.gguf", "hf:unsloth/Tiny-GGUF:BF16")):
        assert _path(scan, name) == home.expected[want], name
    with pytest.raises(ModelFileError):
        M.resolve_name("lmstudio:tinypub/Tiny-GGUF/nothing.gguf", "gguf", scan=scan)


def test_an_ollama_name_without_a_tag_means_latest(home, scan):
    assert _path(scan, "ollama:gemma") == home.expected["ollama:gemma:latest"]
    assert _path(scan, "ollama:gemma:2b") == home.expected["ollama:gemma:2b"]
    with pytest.raises(ModelFileError) as e:
        M.resolve_name("ollama:llama3.2", "gguf", scan=scan)  # ollama itself: "model not found" (no :latest)
    assert "llama3.2:latest" in str(e.value) and "ollama:llama3.2:1b" in str(e.value)
    for long in ("ollama:library/llama3.2:1b", "ollama:registry.ollama.ai/library/llama3.2:1b"):
        assert _path(scan, long) == home.expected["ollama:llama3.2:1b"]
