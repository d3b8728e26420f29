"""`specview models` and store names on the command line: the listing, drafters, folders, problems, and a run by
store names whose trace and report record both names and files and re-run it."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from specview.cli import main
from specview.core import models as M
from specview.core.errors import SpecviewError


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_listing_names_every_model_once_grouped_by_family_and_vocabulary(at_home, capsys):
    code, out, err = run(capsys, "models")
    assert code == 0, err
    shown = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("  NAME")]
    assert len(shown) == len(set(shown))  # each model once
    by_name = {m.name: Path(m.path) for m in M.scan(cache=False).models}
    assert sorted(shown) == sorted(by_name)
    # the models the stores hold, no more (the shipped demo file is the demo's)
    want = {p for n, p in at_home.expected.items() if M.is_store_name(n)}
    assert {by_name[n] for n in shown if not n.startswith("demo:")} == want
    # the five tiny-llama-0 GGUFs share one vocabulary and family: one block
    block = out.split("tiny-llama-0  (vocabulary ")[1].split("\n\n")[0]
    assert {"ollama:tiny:8b", "ollama:tinydraft:q4", "hf:tinyorg/Tiny-Draft-GGUF"} <= set(block.split())


def test_json_listing_and_problems(at_home, capsys, tmp_path):
    bad = tmp_path / "mine"
    bad.mkdir()
    (bad / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    assert run(capsys, "models", "--add-folder", str(bad))[0] == 0
    code, out, _ = run(capsys, "models", "--json")
    d = json.loads(out)
    assert code == 0 and {m["name"] for m in d["models"]} >= {"ollama:tiny:8b", "hf:mlx-community/Tiny-4bit"}
    assert d["problems"] == [{"path": str(bad / "junk.gguf"), "why": d["problems"][0]["why"]}]
    code, out, _ = run(capsys, "models", "--problems")
    assert out.startswith(f"{bad / 'junk.gguf'}: truncated")
    code, out, _ = run(capsys, "models", "--folders")
    assert f"folder     {bad}" in out
    assert run(capsys, "models", "--remove-folder", str(bad))[0] == 0
    assert M.user_folders() == []


def test_drafters_for_a_store_name(at_home, capsys):
    M.add_folder(at_home.user_folder)
    try:
        code, out, err = run(capsys, "models", "--drafters-for", "ollama:tiny")
    finally:
        M.remove_folder(at_home.user_folder)
    assert code == 0, err
    rows = [line.split()[0] for line in out.splitlines()[2:]]
    assert "ollama:tinydraft:q4" in rows and "hf:tinyorg/Tiny-Draft-GGUF" in rows
    assert not any("foreign" in r for r in rows)  # another vocabulary
    assert "ollama:tiny:8b" not in rows  # not its own drafter
    assert rows[-1] == "(none"  # n-gram, needing none, last
    code, out, _ = run(capsys, "models", "--drafters-for", "ollama:tiny", "--json", "--spec-type", "draft-simple")
    d = json.loads(out)
    assert d["target"]["name"] == "ollama:tiny:8b"
    assert all(f["spec_types"] == ["draft-simple"] for f in d["drafters"])


def test_a_missing_store_name_is_an_error_listing_the_candidates(at_home, capsys):
    code, _out, err = run(capsys, "run", "-m", "ollama:nope", "--spec-type", "ngram-simple", "-q")
    assert code == 2
    assert "ollama:nope: no such model in ollama's store; it has ollama:tiny:8b, ollama:tinydraft:q4" in err


def test_the_demo_rows_still_list(capsys):
    code, out, err = run(capsys, "models", "--demo")
    assert code == 0, err
    assert "demo:Q4_1" in out and "demo:dspark" in out


def _argv(command: str) -> list[str]:
    lines = [ln for ln in command.splitlines() if not ln.startswith("#")]
    return shlex.split(" ".join(ln.rstrip("\\") for ln in lines))


def test_a_run_by_store_names_records_both_names_and_files_and_its_report_reruns_it(at_home, capsys, tmp_path):
    from specview.core.models.record import rerun_command
    from specview.core.trace import Trace

    first = tmp_path / "first.json"
    code, out, err = run(capsys, "run", "-m", "ollama:tiny:8b", "-md", "hf:tinyorg/Tiny-Draft-GGUF", "-p",
                         "the cat sat", "--no-chat", "-n", "12", "--ignore-eos", "--n-max", "2", "--json", str(first),
                         "-q")
    assert code in (0, 1), err
    assert out.startswith("target   ollama:tiny:8b = sha256-")
    t = Trace.load(first)
    block = t.config["models"]
    for role, name in (("target", "ollama:tiny:8b"), ("draft", "hf:tinyorg/Tiny-Draft-GGUF")):
        want = at_home.expected[name]
        assert block[role]["name"] == name
        assert os.path.realpath(block[role]["path"]) == os.path.realpath(want)
        assert block[role]["size"] == want.stat().st_size
        assert block[role]["header_hash"] == M.read_header(want).header_hash
        # the vocabulary print's texts hash is the one llama.cpp's loaded vocabulary gives the trace
        assert t.models[role]["vocab_fingerprint"] == M.read_header(want).vocab.texts
    cmd = rerun_command(t)
    argv = _argv(cmd)
    assert argv[:6] == ["specview", "run", "-m", "ollama:tiny:8b", "-md", "hf:tinyorg/Tiny-Draft-GGUF"]
    assert f"# target ollama:tiny:8b: {block['target']['path']} ({block['target']['size']} bytes" in cmd
    second = tmp_path / "second.json"
    code2, _out, err = run(capsys, *argv[1:], "--json", str(second), "-q")
    assert code2 == code, err
    t2 = Trace.load(second)
    assert t2.vanilla.tokens == t.vanilla.tokens and t2.speculative.tokens == t.speculative.tokens
    assert t2.config["models"] == block
    # and the written report carries that command
    code, _out, err = run(capsys, "report", str(first), "-o", str(tmp_path / "rep"))
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Run this again with specview" in md
    assert "specview run -m ollama:tiny:8b -md hf:tinyorg/Tiny-Draft-GGUF" in md
    assert block["draft"]["path"] in md


def test_store_names_resolve_for_the_server_engine(at_home, capsys, tmp_path):
    from require import missing

    binary = os.environ.get("SPECVIEW_LLAMA_SERVER", "")
    if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
        missing("no llama-server: set $SPECVIEW_LLAMA_SERVER (scripts/build-llama-server.sh builds one)",
                switch="SPECVIEW_REQUIRE_SERVER")
    out = tmp_path / "s.json"
    code, _o, err = run(capsys, "run", "--engine", "llama-server", "--server-bin", binary, "-t", "1",
                        "-m", "lmstudio:tinypub/Tiny-GGUF:Q8_0", "-md", "ollama:tinydraft:q4", "-p", "the cat",
                        "--no-chat", "-n", "6", "--ignore-eos", "--no-diagnose", "--json", str(out), "-q")
    assert code in (0, 1), err
    block = json.loads(out.read_text())["config"]["models"]
    assert Path(block["target"]["path"]) == at_home.expected["lmstudio:tinypub/Tiny-GGUF:Q8_0"]
    assert Path(block["draft"]["path"]) == at_home.expected["ollama:tinydraft:q4"]
    assert block["target"]["name"] == "lmstudio:tinypub/Tiny-GGUF:Q8_0"


def test_a_matrix_takes_store_names_and_refuses_a_missing_one(at_home, capsys, tmp_path):
    out = tmp_path / "m.json"
    code, _o, err = run(capsys, "matrix", "-m", "ollama:tiny:8b", "-md", "hf:tinyorg/Tiny-Draft-GGUF,ngram-simple",
                        "-p", "the cat", "--no-chat", "-n", "6", "-t", "1", "-o", str(out), "-q")
    assert code in (0, 1), err
    doc = json.loads(out.read_text())
    assert doc["spec"]["targets"] == ["ollama:tiny:8b"]
    assert doc["spec"]["drafters"] == ["hf:tinyorg/Tiny-Draft-GGUF", "ngram-simple"]
    assert [c["status"] for c in doc["cells"]] == ["ok"] * len(doc["cells"]) and len(doc["cells"]) == 3
    code, _o, err = run(capsys, "matrix", "-m", "ollama:nope", "-md", "ngram-simple", "-p", "x", "-n", "4",
                        "-o", str(tmp_path / "m2.json"), "-q")
    assert code == 2 and "target ollama:nope: no such model in ollama's store" in err


@pytest.mark.parametrize("engine", ["llama.cpp", "llama-server", "mlx", "mlx-server"])
def test_every_engine_turns_a_store_name_into_the_file_or_folder_of_its_kind(at_home, engine):
    """Each engine's resolve (what its runs and jobs load) takes store names of its model kind, and refuses
    the other kind's saying so."""
    from require import missing

    from specview.core.errors import BackendUnavailable
    from specview.core.registry import get_backend

    try:
        be = get_backend(engine)
    except BackendUnavailable as exc:
        missing(f"the {engine} engine is not usable here ({exc})",
                switch="SPECVIEW_REQUIRE_MLX" if engine.startswith("mlx") else "SPECVIEW_REQUIRE_SERVER")
    names = {"gguf": {"ollama:tiny:8b": "ollama:tiny:8b",
                      "hf:tinyorg/Tiny-Multi-GGUF:q8_0": "hf:tinyorg/Tiny-Multi-GGUF:Q8_0",
                      "lmstudio:tinypub/Tiny-GGUF:F32": "lmstudio:tinypub/Tiny-GGUF:F32"},
             "folder": {"hf:mlx-community/Tiny-4bit": "hf:mlx-community/Tiny-4bit",
                        "lmstudio:tinypub/Tiny-MLX": "lmstudio:tinypub/Tiny-MLX"}}
    for name, key in names[be.model_kind].items():
        assert Path(be.resolve(name)) == at_home.expected[key], name
    other = next(iter(names["folder" if be.model_kind == "gguf" else "gguf"]))
    with pytest.raises(SpecviewError, match="this engine needs"):
        be.resolve(other)
