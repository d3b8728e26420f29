"""A cold scan's header reads in spawned processes (:mod:`specview.core.models.reads`): the same models and
problems, in the same order, as reading each file in the scan's own process; every read in the header cache;
a pool that breaks or cannot start loses nothing; an interrupted scan keeps its reads and leaves no reader.

The store is built here with a known answer: 26 good headers (each its own vocabulary), a symlink and a
second root reaching one of them, and five files that are not models (random bytes, a truncated header,
zero bytes, a FIFO, a GGUF of no tensors).  The processes are asked for by ``$SPECVIEW_SCAN_PROCESSES``, so
the pool is used whatever this machine's core count."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specview.core import models as M
from specview.core.models import header, reads
from stores import header_gguf

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="the store holds a FIFO (POSIX)")

GOOD = 26


def _store(top: Path) -> tuple[list[M.Root], set[str], set[str]]:
    """The store under ``top``: its roots, the files that are models (each one model, however many finds reach
    it), the paths that are problems."""
    mine, more = top / "mine", top / "more"
    good = [header_gguf(mine / f"m{i:03d}.gguf", "llama", extra=f"v{i}") for i in range(GOOD)]
    (mine / "link.gguf").symlink_to(good[3])
    more.mkdir()
    (more / "same.gguf").symlink_to(good[5])
    bad = [mine / "random.gguf", mine / "truncated.gguf", mine / "zero.gguf", mine / "pipe.gguf", mine / "proj.gguf"]
    bad[0].write_bytes(os.urandom(4096))
    bad[1].write_bytes(good[0].read_bytes()[:300])
    bad[2].write_bytes(b"")
    os.mkfifo(bad[3])
    header_gguf(bad[4], "clip")
    return [M.Root("folder", str(mine)), M.Root("folder", str(more))], {str(p) for p in good}, {str(p) for p in bad}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return _store(tmp_path_factory.mktemp("parallel"))


def _scan(roots, cache: Path, processes: str, lines: list[str] | None = None, **kw):
    env = {"SPECVIEW_CACHE": str(cache), "SPECVIEW_SCAN_PROCESSES": processes}
    return M.scan(roots, home=cache.parent, env=env, progress=None if lines is None else lines.append, **kw)


def _facts(scan) -> tuple[list, list]:
    return [(m.path, m.name, m.aliases, m.vocab, m.header_hash) for m in scan.models], [(p.path, p.why) for p in scan.problems]


@pytest.fixture(scope="module")
def serial(store, tmp_path_factory):
    """The scan with every header read in this process (the reference)."""
    lines: list[str] = []
    scan = _scan(store[0], tmp_path_factory.mktemp("serial") / "cache", "1", lines)
    assert not any(" in " in ln for ln in lines if ln.startswith("reading "))
    return scan


def test_the_store_is_what_it_was_built_to_be(store, serial):
    """The reference itself, against the layout: every good file a model, every other file one problem."""
    _, models, bad = store
    assert sorted(os.path.realpath(m.path) for m in serial.models) == sorted(models)  # one model per file
    assert sorted(p.path for p in serial.problems) == sorted(bad)
    assert len({m.vocab.digest for m in serial.models}) == GOOD
    five = next(m for m in serial.models if m.path.endswith("m005.gguf"))
    assert any("same.gguf" in n for n in five.aliases)  # the second root's link is a name of the same model


def test_reads_in_processes_give_the_models_and_problems_of_reading_one_by_one(store, serial, tmp_path):
    lines: list[str] = []
    par = _scan(store[0], tmp_path / "cache", "3", lines)
    assert f"reading {GOOD + 4} headers in 3 processes" in lines  # the pool was used
    assert _facts(par) == _facts(serial)  # the same, in the same order
    assert par.models == serial.models


def test_every_read_in_processes_is_in_the_header_cache(store, serial, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _scan(store[0], cache, "2")
    saved = json.loads((cache / "models" / "headers.json").read_text())["entries"]
    files = {os.path.realpath(Path(r.path) / n) for r in store[0] for n in os.listdir(r.path)}
    files.discard(os.path.realpath(Path(store[0][0].path) / "pipe.gguf"))  # never opened
    assert {os.path.realpath(k) for k in saved} == files and len(saved) == GOOD + 4  # each file once
    assert sum("error" in e for e in saved.values()) == 4  # random, truncated, zero bytes, projector

    def no_read(*a):
        raise AssertionError("a warm scan read a header")

    monkeypatch.setattr(header, "_read", no_read)
    monkeypatch.setattr(reads, "read_one", no_read)
    assert _facts(_scan(store[0], cache, "2")) == _facts(serial)


def _gone(timeout: float = 20.0) -> list:
    """The child processes still alive after up to ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < end:
        time.sleep(0.1)
    return multiprocessing.active_children()


def test_a_reader_killed_mid_scan_loses_no_model(tmp_path, monkeypatch):
    """A spawned reader dies on one file (as a native crash would): the pool breaks, and what it had not read
    is read in the scan's own process, the file it died on included."""
    import dying

    top = tmp_path / "store"
    roots, models, bad = _store(top)
    victim = Path(roots[0].path) / "m007-die.gguf"
    os.rename(Path(roots[0].path) / "m007.gguf", victim)
    monkeypatch.setattr(reads, "read_one", dying.read_or_die)
    lines: list[str] = []
    scan = _scan(roots, tmp_path / "cache", "2", lines)
    assert f"reading {GOOD + 4} headers in 2 processes" in lines
    assert sorted(os.path.realpath(m.path) for m in scan.models) == sorted(
        (models - {str(Path(roots[0].path) / "m007.gguf")}) | {str(victim)})
    assert sorted(p.path for p in scan.problems) == sorted(bad)
    assert not _gone()


def test_a_pool_that_cannot_start_reads_one_by_one(store, serial, tmp_path, monkeypatch):
    def no_pool(*a, **kw):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(reads, "ProcessPoolExecutor", no_pool)
    assert _facts(_scan(store[0], tmp_path / "cache", "4")) == _facts(serial)


def test_an_interrupted_scan_in_processes_keeps_its_reads_and_leaves_no_reader(store, tmp_path):
    cache = tmp_path / "cache"

    def stop(line: str) -> None:
        if line.startswith(f"read {reads.REPORT_EVERY} of"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        M.scan(store[0], home=tmp_path, env={"SPECVIEW_CACHE": str(cache), "SPECVIEW_SCAN_PROCESSES": "2"},
               progress=stop)
    saved = json.loads((cache / "models" / "headers.json").read_text())["entries"]
    assert len(saved) >= reads.REPORT_EVERY
    assert not _gone()


def test_the_cli_lists_the_same_models_read_in_processes(store, tmp_path):
    """``specview models`` as a user runs it (``python -m specview``: a spawned reader must not run the CLI)."""
    env = {**os.environ, "HOME": str(tmp_path), "SPECVIEW_CACHE": str(tmp_path / "cache"),
           "SPECVIEW_CONFIG_DIR": str(tmp_path / "config")}
    for k in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "XDG_CACHE_HOME"):
        env.pop(k, None)

    def cli(*args: str, processes: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "specview", "models", *args], capture_output=True, text=True,
                              timeout=120, env={**env, "SPECVIEW_SCAN_PROCESSES": processes})

    for r in store[0]:
        assert cli("--add-folder", r.path, processes="1").returncode == 0
    one = cli("--json", "--no-cache", processes="1")
    many = cli("--json", "--no-cache", processes="2")
    assert one.returncode == many.returncode == 0, (one.stderr, many.stderr)
    listed = json.loads(one.stdout)
    assert sorted(os.path.realpath(m["path"]) for m in listed["models"] if m.get("source") == "folder") == \
        sorted(store[1])
    assert json.loads(many.stdout) == listed


@pytest.mark.parametrize("raw, want, problem", [("", None, False), ("0", None, False), ("1", 1, False),
                                                 ("6", 6, False), ("four", 1, True), ("-2", 1, True)])
def test_the_variable_asks_for_processes_or_is_named_when_wrong(raw, want, problem):
    got, bad = reads.wanted_processes({reads.PROCESSES_VARIABLE: raw})
    assert got == want
    assert (bad is not None) == problem
    if problem:
        assert bad.path == "$SPECVIEW_SCAN_PROCESSES" and repr(raw) in bad.why


def test_how_many_processes_a_scan_decides(monkeypatch):
    monkeypatch.setattr(reads, "usable_cores", lambda: 4)
    assert reads.processes_for(reads.THRESHOLD - 1) == 1  # too few reads to pay for a process
    assert reads.processes_for(reads.THRESHOLD) == min(4, reads.THRESHOLD // reads.SHARE)
    assert reads.processes_for(1000) == 4
    assert reads.processes_for(5, want=3) == 3 and reads.processes_for(2, want=8) == 2
    monkeypatch.setattr(reads, "usable_cores", lambda: 64)
    assert reads.processes_for(1000) == reads.MAX_PROCESSES
    monkeypatch.setattr(reads, "usable_cores", lambda: 1)
    assert reads.processes_for(1000) == 1
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert reads.processes_for(1000, want=4) == 1  # a frozen app's executable is no Python to spawn
