"""``specview matrix --resume`` on real tiny llama.cpp models.

A cell that failed is run again (a target that could not be loaded the first
time, repaired before the resumption), a finished cell is kept as it was, and
a resumption on another machine, build or thread count is refused before the
matrix file is touched: a fork depends on all three, so such cells must never
be mixed into one matrix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tinymodel import write_tiny_llama

from specview import cli
from specview.core.config import EngineSettings, RunConfig
from specview.core.matrix import load_matrix
from specview.core.session import Session

PROMPT = "the cat sat on the"


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    a = write_tiny_llama(tmp_path / "a.gguf", seed=0)
    d = write_tiny_llama(tmp_path / "d.gguf", seed=0, noise=0.3)
    b = tmp_path / "b.gguf"
    b.write_bytes(b"GGUF" + bytes(64))  # llama.cpp cannot load it: every cell of target b fails
    return {"a": a, "b": b, "d": d}


def argv(models: dict[str, Path], out: Path, threads: str = "1") -> list[str]:
    return ["matrix", "--targets", f"{models['a']},{models['b']}", "--drafters", f"{models['d']},none",
            "--n-max", "3", "--p-min", "0", "-p", PROMPT, "-n", "16", "--no-chat", "--ignore-eos", "-t", threads, "--no-diagnose",
            "-o", str(out)]


def first_run(models: dict[str, Path], out: Path, threads: str = "1") -> dict:
    assert cli.main(argv(models, out, threads)) == 2  # some cells failed
    doc = load_matrix(out)
    status = {c["params"]["target"]: set() for c in doc["cells"]}
    for c in doc["cells"]:
        status[c["params"]["target"]].add(c["status"])
    assert status == {str(models["a"]): {"ok"}, str(models["b"]): {"error"}}, status
    return doc


def test_resume_runs_the_failed_cells_again_and_keeps_the_finished_ones(models, tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    first = first_run(models, out)
    write_tiny_llama(models["b"], seed=3)  # the target is repaired
    capsys.readouterr()
    rc = cli.main(argv(models, out) + ["--resume"])
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    assert "resuming: 2 of 4 cells already done" in err
    doc = load_matrix(out)
    assert doc["status"] == "complete" and [c["status"] for c in doc["cells"]] == ["ok"] * 4
    kept = [c for c in first["cells"] if c["status"] == "ok"]
    assert [c for c in doc["cells"] if c["index"] in {k["index"] for k in kept}] == kept  # not run again
    # the retried cells are real runs of the repaired file: the same tokens as a run of it on its own
    with Session() as s:
        for c in doc["cells"]:
            if c["params"]["target"] != str(models["b"]):
                continue
            draft = None if c["params"]["drafter"] == "none" else c["params"]["drafter"]
            t = s.run(RunConfig(target=str(models["b"]), draft=draft, spec_type="none" if draft is None
                                else "draft-simple", n_max=3, max_tokens=16, prompt=PROMPT, chat=False,
                                ignore_eos=True, engine=EngineSettings(threads=1)))
            assert c["n_vanilla"] == len(t.vanilla.tokens) == 16
            assert c["identical"] is t.comparison.identical and c["n_drafted"] == t.speculative.n_drafted
    # only the repaired target and the draft were loaded by the resumption
    assert doc["counters"]["loads"] == 2, doc["counters"]


def _refused(models, out: Path, capsys, threads: str = "1") -> str:
    before = out.read_bytes()
    capsys.readouterr()
    rc = cli.main(argv(models, out, threads) + ["--resume"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "cannot resume" in err, err
    assert out.read_bytes() == before  # nothing was written over the kept cells
    return err


def test_resume_from_another_machine_is_refused(models, tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    doc = first_run(models, out)
    write_tiny_llama(models["b"], seed=3)
    doc["environment"]["cpu"] = "Another CPU (made elsewhere)"
    out.write_text(json.dumps(doc), encoding="utf-8")
    err = _refused(models, out, capsys)
    assert "cpu: Another CPU (made elsewhere) (kept cells)" in err


def test_resume_from_another_llama_cpp_build_is_refused(models, tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    doc = first_run(models, out)
    write_tiny_llama(models["b"], seed=3)
    doc["environment"]["llama_cpp_python"] = "0.0.1"
    out.write_text(json.dumps(doc), encoding="utf-8")
    assert "llama_cpp_python: 0.0.1 (kept cells)" in _refused(models, out, capsys)


def test_resume_at_another_thread_count_is_refused(models, tmp_path: Path, capsys, monkeypatch):
    """``-t 0`` is the same setting on every machine, but not the same thread split: the count used is compared."""
    out = tmp_path / "m.json"
    monkeypatch.setenv("SPECVIEW_THREADS", "1")
    first_run(models, out, threads="0")
    write_tiny_llama(models["b"], seed=3)
    monkeypatch.setenv("SPECVIEW_THREADS", "2")
    assert "threads_used: 1 (kept cells) vs 2 (now)" in _refused(models, out, capsys, threads="0")
