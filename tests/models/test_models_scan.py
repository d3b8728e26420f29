"""Discovery on fake LM Studio, ollama, Hugging Face and llama.cpp stores: what is found, what each name form
resolves to, and what the headers say, checked against the layout the test built and an independent reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specview.core import models as M
from specview.core.errors import ModelFileError, SpecviewError
from stores import FTYPES
from tinymodel import vocab_tokens


def kind_of(p: Path) -> str:
    return "folder" if p.is_dir() else "gguf"


def test_every_name_form_resolves_to_the_file_the_store_holds(stores):
    scan = M.scan(home=stores.home, env=stores.env(), cache=False)
    assert scan.problems == []
    for name, path in stores.expected.items():
        if not M.is_store_name(name):
            continue  # the user folder's file: named by its path once the folder is added
        got = M.resolve_name(name, kind_of(path), scan=scan)
        assert Path(got.path) == path, name


def test_names_resolve_from_the_default_roots_of_the_home(at_home):
    """resolve_name without a scan looks where the process's HOME says: the name forms of every store."""
    for name in ("ollama:tiny:8b", "ollama:tiny", "hf:tinyorg/Tiny-Draft-GGUF", "lmstudio:tinypub/Tiny-GGUF:Q8_0",
                 "llama.cpp:tinyorg/Tiny-GGUF:Q4_K_M"):
        assert Path(M.resolve_name(name, "gguf").path) == at_home.expected[name]
    assert Path(M.resolve_name("hf:mlx-community/Tiny-4bit", "folder").path) == \
        at_home.expected["hf:mlx-community/Tiny-4bit"]


def test_one_ollama_blob_under_two_tags_is_one_model_with_both_names(stores):
    scan = M.scan(home=stores.home, env=stores.env(), cache=False)
    blob = stores.expected["ollama:tiny:8b"]
    found = [m for m in scan.models if Path(m.path) == blob]
    assert len(found) == 1
    assert found[0].name == "ollama:tiny:8b"
    assert set(found[0].aliases) == {"ollama:tiny:latest", "ollama:tiny"}
    # every model the stores hold is listed once: the expected paths, less the user folder's (not added)
    want = {p for n, p in stores.expected.items() if M.is_store_name(n)}
    assert {Path(m.path) for m in scan.models if m.source != "demo"} == want


@pytest.mark.parametrize("name", ["lmstudio:tinypub/Tiny-GGUF", "hf:tinyorg/Tiny-Multi-GGUF"])
def test_an_ambiguous_name_lists_the_names_that_are_not(stores, name):
    scan = M.scan(home=stores.home, env=stores.env(), cache=False)
    with pytest.raises(ModelFileError) as e:
        M.resolve_name(name, "gguf", scan=scan)
    msg = str(e.value)
    assert "matches 2 models" in msg
    for cand in stores.ambiguous[name]:
        assert cand in msg
        assert Path(M.resolve_name(cand, "gguf", scan=scan).path) == stores.expected[cand]


def test_a_missing_name_lists_what_the_store_has_and_a_wrong_kind_says_so(stores):
    scan = M.scan(home=stores.home, env=stores.env(), cache=False)
    with pytest.raises(ModelFileError, match=r"ollama:qwen3:8b: no such model in ollama's store; it has "
                                             r"ollama:tiny:8b, ollama:tinydraft:q4"):
        M.resolve_name("ollama:qwen3:8b", "gguf", scan=scan)
    with pytest.raises(ModelFileError, match="is a model folder .* needs a GGUF file"):
        M.resolve_name("hf:mlx-community/Tiny-4bit", "gguf", scan=scan)
    with pytest.raises(ModelFileError, match="is a GGUF file .* needs a model folder"):
        M.resolve_name("ollama:tiny:8b", "folder", scan=scan)
    empty = M.scan([], cache=False)
    with pytest.raises(ModelFileError, match="LM Studio's models has no gguf models"):
        M.resolve_name("lmstudio:a/b", "gguf", scan=empty)


def test_is_store_name():
    assert M.is_store_name("ollama:qwen3:8b") and M.is_store_name("hf:org/repo:Q4_K_M")
    assert M.is_store_name("LMStudio:pub/repo") and M.is_store_name("llama.cpp:org/repo:Q8_0")
    for s in ("demo:Q8_0", "/tmp/x.gguf", "model.gguf", "hf:", "ollama", "", "mlx-community/x"):
        assert not M.is_store_name(s), s


def test_a_path_that_exists_is_never_a_store_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf:odd").write_text("x")
    assert not M.is_store_name("hf:odd")


def test_gguf_facts_match_an_independent_reader(stores):
    """Parameter count, context, quantization and vocabulary, against the gguf package's own reading."""
    import gguf

    for name in ("ollama:tiny:8b", "hf:tinyorg/Tiny-Multi-GGUF:Q4_K_M", "lmstudio:tinypub/Tiny-GGUF:F32"):
        path = stores.expected[name]
        info = M.read_header(path)
        r = gguf.GGUFReader(str(path))
        assert info.n_params == sum(int(t.n_elements) for t in r.tensors)
        assert info.n_ctx == int(r.fields["llama.context_length"].parts[-1][0]) == 2048
        assert info.n_embd == 64 and info.n_layer == 2 and info.arch == "llama"
        ftype = int(r.fields["general.file_type"].parts[-1][0])
        assert info.quant == {v: k for k, v in FTYPES.items()}[ftype]
        assert info.size == path.stat().st_size
        toks = vocab_tokens()[0]
        assert info.vocab.n == len(toks)
        assert not info.mtp and info.drafter_kind is None


def test_vocabulary_prints_tell_one_vocabulary_from_another(stores):
    same = [M.read_header(stores.expected[n]).vocab for n in ("ollama:tiny:8b", "hf:tinyorg/Tiny-Draft-GGUF",
                                                              "hf:tinyorg/Tiny-Multi-GGUF:Q8_0")]
    foreign = M.read_header(next(p for n, p in stores.expected.items() if n.endswith("foreign.gguf"))).vocab
    assert same[0] == same[1] == same[2]
    assert foreign.n == same[0].n and foreign.digest != same[0].digest and foreign.texts != same[0].texts


def test_model_folder_facts(stores):
    from stores import folder_params

    info = M.read_header(stores.expected["hf:mlx-community/Tiny-4bit"])
    assert info.kind == "folder" and info.quant == "4bit" and info.arch == "llama"
    assert info.n_params == folder_params()
    assert info.n_ctx == 2048 and info.vocab.n == len(vocab_tokens()[0])
    assert info.size == sum(f.stat().st_size for f in Path(info.path).iterdir())


def test_the_demo_models_appear_where_they_are_cached(demo_paths, tmp_path, monkeypatch):
    from specview.core.paths import cache_dir

    real_cache = cache_dir()  # where the demo fixture derived them
    scan = M.scan(home=tmp_path, env={"SPECVIEW_CACHE": str(real_cache)}, cache=False)
    by_name = {m.name: m for m in scan.models if m.source == "demo"}
    for q, path in demo_paths.items():
        assert Path(by_name[f"demo:{q}"].path) == Path(path)
        assert by_name[f"demo:{q}"].quant == q
    assert by_name["demo:Q4_1"].aliases == ("demo",)  # the shipped file


def test_user_folders_are_remembered_scanned_and_forgotten(stores, tmp_path):
    cfg = tmp_path / "config"
    env = {**stores.env(), "SPECVIEW_CONFIG_DIR": str(cfg)}
    foreign = next(p for n, p in stores.expected.items() if n.endswith("foreign.gguf"))
    assert M.user_folders(cfg) == []
    assert M.add_folder(stores.user_folder, cfg) == [str(stores.user_folder)]
    assert M.add_folder(stores.user_folder, cfg) == [str(stores.user_folder)]  # once only
    assert json.loads((cfg / "models.json").read_text()) == {"folders": [str(stores.user_folder)]}
    scan = M.scan(home=stores.home, env=env, cache=False)
    m = next(m for m in scan.models if m.source == "folder")
    assert Path(m.path) == foreign and m.name == str(foreign)
    with pytest.raises(SpecviewError, match="not a folder"):
        M.add_folder(foreign, cfg)
    listed = r"not one of the model folders .*\(those are: " + str(stores.user_folder) + r"\)"
    with pytest.raises(SpecviewError, match=listed):
        M.remove_folder(tmp_path, cfg)
    assert M.remove_folder(stores.user_folder, cfg) == []
    assert not any(m.source == "folder" for m in M.scan(home=stores.home, env=env, cache=False).models)


def test_a_damaged_folders_file_is_a_problem_not_a_crash(stores, tmp_path):
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "models.json").write_text("{not json")
    scan = M.scan(home=stores.home, env={**stores.env(), "SPECVIEW_CONFIG_DIR": str(cfg)}, cache=False)
    assert [p.path for p in scan.problems] == [str(cfg)]
    assert "fix or delete the file" in scan.problems[0].why
    assert any(m.name == "ollama:tiny:8b" for m in scan.models)
    with pytest.raises(SpecviewError, match="fix or delete"):
        M.add_folder(stores.user_folder, cfg)  # the user's list is never silently replaced


def test_env_variables_move_the_stores(stores, tmp_path):
    """$OLLAMA_MODELS, $HF_HUB_CACHE and $LLAMA_CACHE are looked in (a home with none of the default folders)."""
    env = {"OLLAMA_MODELS": str(stores.home / ".ollama" / "models"),
           "HF_HUB_CACHE": str(stores.home / ".cache" / "huggingface" / "hub"),
           "LLAMA_CACHE": str(stores.home / ".cache" / "llama.cpp"), "SPECVIEW_CACHE": str(tmp_path / "c")}
    roots = M.default_roots(home=tmp_path, env=env)
    assert [(r.source, r.path) for r in roots if r.source != "demo"] == [
        ("ollama", env["OLLAMA_MODELS"]), ("hf", env["HF_HUB_CACHE"]), ("llama.cpp", env["LLAMA_CACHE"])]
    names = {m.name for m in M.scan(roots, home=tmp_path, env=env, cache=False).models}
    assert {"ollama:tiny:8b", "hf:tinyorg/Tiny-Draft-GGUF", "llama.cpp:loose.gguf"} <= names
    assert not any(n.startswith("lmstudio:") for n in names)


def test_lm_studio_settings_point_at_its_downloads_folder(stores, tmp_path):
    home = tmp_path / "h"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".lmstudio" / "settings.json").write_text(json.dumps(
        {"downloadsFolder": str(stores.home / ".lmstudio" / "models")}))
    roots = M.default_roots(home=home, env={})
    assert ("lmstudio", str(stores.home / ".lmstudio" / "models")) in [(r.source, r.path) for r in roots]


def test_the_header_cache_answers_a_warm_scan_and_notices_a_change(stores, tmp_path, monkeypatch):
    from specview.core.models import header

    env = {**stores.env(), "SPECVIEW_CACHE": str(tmp_path / "cache")}
    cold = M.scan(home=stores.home, env=env)
    assert (tmp_path / "cache" / "models" / "headers.json").is_file()
    reads = []
    real = header._read
    monkeypatch.setattr(header, "_read", lambda *a: reads.append(a[0]) or real(*a))
    warm = M.scan(home=stores.home, env=env)
    assert reads == [] and warm.models == cold.models
    # a file rewritten (another quantization): its size or mtime changes, so it is read again
    target = stores.expected["llama.cpp:loose.gguf"]
    from stores import set_file_type

    set_file_type(target, "Q8_0")
    import os

    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    again = M.scan(home=stores.home, env=env)
    assert reads == [target]
    assert next(m for m in again.models if m.name == "llama.cpp:loose.gguf").quant == "Q8_0"
    set_file_type(target, "F32")
