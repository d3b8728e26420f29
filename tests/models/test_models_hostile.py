"""Discovery against files made to stall it: FIFOs, sockets and devices wherever a store keeps a file, a sparse
GGUF whose header claims arrays of millions of arrays, an interrupted scan, and GGUFs that are not models
(projectors, files of no tensors, llama.cpp's vocabulary-only files).

Every scan here runs under :func:`within`: a read that blocks fails the test instead of hanging the suite
(and the FIFOs are opened for writing afterwards, which lets any blocked reader go)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specview.core import models as M
from specview.core.errors import ModelFileError
from specview.core.models import gguf, header
from stores import build_stores, header_gguf, tiny_folder, tiny_gguf

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")


def _release(fifos: list[Path]) -> None:
    """Open every FIFO for writing (non-blocking): a reader stuck in open() on one of them returns."""
    for f in fifos:
        try:
            os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waiting (ENXIO), or gone


def within(seconds: float, fn, *args, fifos: list[Path] = (), **kw):
    """``fn(*args, **kw)``, failing the test when it takes longer than ``seconds`` (a blocked open)."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        _release(list(fifos))
        t.join(5)
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {seconds} s (blocked on a FIFO?)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def fifo(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() or p.is_symlink():
        p.unlink()
    os.mkfifo(p)
    return p


@pytest.fixture
def fifo_home(tmp_path):
    """A home with every store, and a FIFO in every place discovery opens a file."""
    s = build_stores(tmp_path / "home")
    h = s.home
    planted: dict[str, Path] = {}
    lm = h / ".lmstudio" / "models"
    planted["lmstudio gguf"] = fifo(lm / "fifopub" / "Pipe-GGUF" / "x.gguf")
    planted["user folder gguf"] = fifo(s.user_folder / "x.gguf")
    planted["llama.cpp gguf"] = fifo(h / ".cache" / "llama.cpp" / "x.gguf")
    planted["demo gguf"] = fifo(h / ".cache" / "specview" / "demo" / "SmolLM2-135M-Instruct.Q8_0.gguf")
    # the hub: a snapshot's file is a link to a blob that is a FIFO
    hub = h / ".cache" / "huggingface" / "hub" / "models--fifoorg--Pipe-GGUF"
    blob = fifo(hub / "blobs" / ("ab" * 32))
    link = hub / "snapshots" / ("0" * 40) / "x.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    planted["hf gguf"] = link
    # refs/main of a good repository
    refs = h / ".cache" / "huggingface" / "hub" / "models--tinyorg--Tiny-Draft-GGUF" / "refs" / "main"
    planted["hf refs/main"] = fifo(refs)
    # ollama: a manifest that is a FIFO, and a manifest naming a blob that is one
    mdir = h / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library"
    planted["ollama manifest"] = fifo(mdir / "pipe" / "latest")
    digest = "cd" * 32
    planted["ollama blob"] = fifo(h / ".ollama" / "models" / "blobs" / f"sha256-{digest}")
    (mdir / "piped" / "latest").parent.mkdir(parents=True)
    (mdir / "piped" / "latest").write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"}]}))
    planted["ollama blob manifest"] = mdir / "piped" / "latest"
    # llama.cpp: a download manifest that is a FIFO
    planted["llama.cpp manifest"] = fifo(h / ".cache" / "llama.cpp" / "manifest=fifoorg=Pipe-GGUF=Q4_0.json")
    # MLX folders: config.json a FIFO; a model.safetensors a FIFO
    cfg_dir = tiny_folder(lm / "fifopub" / "Pipe-MLX")
    planted["mlx config.json"] = fifo(cfg_dir / "config.json")
    st_dir = tiny_folder(lm / "fifopub" / "Pipe2-MLX")
    planted["mlx safetensors"] = fifo(st_dir / "model.safetensors")
    # LM Studio's own settings and home pointer; specview's list of folders and its header cache
    planted["lmstudio settings.json"] = fifo(h / ".lmstudio" / "settings.json")
    planted["lmstudio home pointer"] = fifo(h / ".lmstudio-home-pointer")
    planted["models.json"] = fifo(h / ".config" / "specview" / "models.json")
    planted["header cache"] = fifo(h / ".cache" / "specview" / "models" / "headers.json")
    yield s, planted
    _release(list(planted.values()))


def _problems(scan) -> dict[str, str]:
    return {p.path: p.why for p in scan.problems}


def test_a_fifo_anywhere_discovery_opens_a_file_is_skipped_with_a_reason(fifo_home):
    s, planted = fifo_home
    fifos = [p for p in planted.values()]
    scan = within(30, M.scan, home=s.home, env=s.env(), fifos=fifos)
    why = _problems(scan)
    for key in ("lmstudio gguf", "llama.cpp gguf", "demo gguf", "hf gguf", "hf refs/main"):
        assert "FIFO" in why[str(planted[key])], (key, scan.problems)
    assert "not an ollama manifest (a FIFO" in why[str(planted["ollama manifest"])]
    assert "FIFO" in why[str(planted["ollama blob manifest"])]
    assert "not a llama.cpp download manifest (a FIFO" in why[str(planted["llama.cpp manifest"])]
    assert "config.json is a FIFO" in why[str(planted["mlx config.json"].parent)]
    assert "model.safetensors is a FIFO" in why[str(planted["mlx safetensors"].parent)]
    config = s.home / ".config" / "specview"
    assert "FIFO" in why[str(config)]  # models.json: the list of folders cannot be read
    assert all("\n" not in w for w in why.values())
    # the good models are all still found (the hub repository whose refs/main is a FIFO by its newest snapshot)
    found = {Path(m.path) for m in scan.models}
    assert {p for n, p in s.expected.items() if M.is_store_name(n)} <= found
    assert not any(Path(m.path) in planted.values() for m in scan.models)
    # the header cache in place of a FIFO: the scan wrote a real one over it, and a warm scan reads it
    cache = s.home / ".cache" / "specview" / "models" / "headers.json"
    assert cache.is_file() and json.loads(cache.read_text())["entries"]
    again = within(30, M.scan, home=s.home, env=s.env(), fifos=fifos)
    assert [m.name for m in again.models] == [m.name for m in scan.models]


def test_a_socket_and_a_device_named_gguf_are_skipped(tmp_path):
    top = tmp_path / "mine"
    top.mkdir()
    good = tiny_gguf(top / "good.gguf")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(top / "sock.gguf"))
        sock.listen(1)
        (top / "dev.gguf").symlink_to("/dev/zero")
        scan = within(20, M.scan, [M.Root("folder", str(top))], cache=False)
    finally:
        sock.close()
    why = _problems(scan)
    assert "a socket, not a regular file" in why[str(top / "sock.gguf")]
    assert "a character device, not a regular file" in why[str(top / "dev.gguf")]
    assert [Path(m.path) for m in scan.models] == [good]


def test_read_header_and_the_reader_refuse_a_fifo_without_blocking(tmp_path):
    p = fifo(tmp_path / "x.gguf")
    try:
        with pytest.raises(M.ModelHeaderError, match="a FIFO"):
            within(10, M.read_header, p, fifos=[p])
        with pytest.raises(OSError, match="a FIFO"):
            within(10, gguf.read, p, fifos=[p])
    finally:
        _release([p])


def test_a_store_name_resolves_past_a_fifo_and_specview_models_finishes(fifo_home):
    """The CLI in its own process, as a user runs it: it ends, with the listing, never waits on a FIFO."""
    s, planted = fifo_home
    env = {**os.environ, **s.env()}
    for k in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "XDG_CACHE_HOME"):
        env.pop(k, None)
    try:
        done = subprocess.run([sys.executable, "-m", "specview", "models"], env=env, capture_output=True,
                              text=True, timeout=60)
    finally:
        _release(list(planted.values()))
    assert done.returncode == 0, done.stderr
    assert "ollama:tiny:8b" in done.stdout and "skipped: specview models --problems" in done.stdout
    scan = within(30, M.scan, home=s.home, env=s.env(), fifos=list(planted.values()))
    assert M.resolve_name("ollama:tiny:8b", "gguf", scan=scan).path == str(s.expected["ollama:tiny:8b"])
    with pytest.raises(ModelFileError, match=r"ollama:pipe: the scan skipped it: .*a FIFO"):
        M.resolve_name("ollama:pipe", "gguf", scan=scan)
    with pytest.raises(ModelFileError, match=r"lmstudio:fifopub/Pipe-GGUF: the scan skipped it: .*a FIFO"):
        M.resolve_name("lmstudio:fifopub/Pipe-GGUF", "gguf", scan=scan)


# -- a header that claims unbounded work -------------------------------------------------------------------------


def _sparse_nested(path: Path, keys: int = 10, n: int = (1 << 24) - 1) -> Path:
    """GGUF v3, no tensors, ``keys`` keys each an array of ``n`` arrays; each inner array is 12 zero bytes (an
    empty uint8 array), left as a hole in a sparse file (2 GB claimed, a few KB written)."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<4sIQQ", b"GGUF", 3, 0, keys))
        for i in range(keys):
            key = f"crafted.key{i}".encode()
            fh.write(struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 9, n))
            fh.seek(n * 12, os.SEEK_CUR)
        fh.write(b"\0")
    return path


def test_a_sparse_header_of_nested_arrays_is_refused_not_walked(tmp_path):
    p = _sparse_nested(tmp_path / "crafted.gguf")
    assert p.stat().st_size > 2_000_000_000
    with pytest.raises(M.ModelHeaderError, match="nested arrays, beyond any real model's"):
        within(20, M.read_header, p)
    scan = within(20, M.scan, [M.Root("folder", str(tmp_path))], cache=False)
    assert scan.models == [] and [x.path for x in scan.problems] == [str(p)]


def test_many_small_nested_arrays_share_one_budget(tmp_path):
    """Each key under the limit, together over it: the budget is the file's, not each key's."""
    p = _sparse_nested(tmp_path / "many.gguf", keys=40, n=gguf.MAX_NESTED // 8)
    with pytest.raises(gguf.GGUFError, match="nested arrays"):
        within(20, gguf.read, p)


def test_strings_and_bytes_past_the_budget_are_refused(tmp_path):
    # 10 keys of 2^24 - 1 empty strings (8 zero bytes each, a hole in the file)
    p = tmp_path / "strings.gguf"
    with open(p, "wb") as fh:
        fh.write(struct.pack("<4sIQQ", b"GGUF", 3, 0, 10))
        for i in range(10):
            key = f"k{i}".encode()
            fh.write(struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, (1 << 24) - 1))
            fh.seek(((1 << 24) - 1) * 8, os.SEEK_CUR)
        fh.write(b"\0")
    with pytest.raises(gguf.GGUFError, match="strings, beyond any real model's"):
        within(20, gguf.read, p)
    # one array of 2^24 uint64 token types: 128 MB of header, past the bound on its bytes
    q = tmp_path / "bytes.gguf"
    key = b"tokenizer.ggml.token_type"
    with open(q, "wb") as fh:
        fh.write(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1))
        fh.write(struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 10, (1 << 24) - 1))
        fh.seek(((1 << 24) - 1) * 8, os.SEEK_CUR)
        fh.write(b"\0")
    with pytest.raises(gguf.GGUFError, match=f"past {gguf.MAX_HEADER >> 20} MB"):
        within(20, gguf.read, q)


# -- the cache keeps what an interrupted scan read ------------------------------------------------------------------


def _folder_of(top: Path, n: int) -> list[Path]:
    top.mkdir(parents=True, exist_ok=True)
    first = tiny_gguf(top / "m000.gguf")
    data = first.read_bytes()
    out = [first]
    for i in range(1, n):
        out.append(top / f"m{i:03d}.gguf")
        out[-1].write_bytes(data)
    return out


def test_an_interrupted_scan_keeps_what_it_read(tmp_path, monkeypatch):
    files = _folder_of(tmp_path / "mine", 10)
    env = {"SPECVIEW_CACHE": str(tmp_path / "cache")}
    roots = [M.Root("folder", str(tmp_path / "mine"))]
    reads: list[Path] = []
    real = header._read

    def stop_at_seventh(path, *a):
        if len(reads) == 6:
            raise KeyboardInterrupt
        reads.append(path)
        return real(path, *a)

    monkeypatch.setattr(header, "_read", stop_at_seventh)
    with pytest.raises(KeyboardInterrupt):
        M.scan(roots, home=tmp_path, env=env)
    saved = json.loads((tmp_path / "cache" / "models" / "headers.json").read_text())["entries"]
    assert sorted(saved) == sorted(str(p) for p in reads) and len(saved) == 6
    again: list[Path] = []
    monkeypatch.setattr(header, "_read", lambda path, *a: again.append(path) or real(path, *a))
    scan = M.scan(roots, home=tmp_path, env=env)
    assert len(scan.models) == 10
    assert sorted(again) == sorted(set(files) - set(reads))  # only the four it had not read


def test_the_cache_is_written_as_the_scan_goes(tmp_path, monkeypatch):
    """A scan killed outright (no finally runs) still leaves the reads of every whole SAVE_EVERY behind: what
    the file holds while the eighth header is read is the first six."""
    _folder_of(tmp_path / "mine", 8)
    monkeypatch.setattr(header.HeaderCache, "SAVE_EVERY", 3)
    cache = tmp_path / "cache" / "models" / "headers.json"
    seen: list[int] = []
    real = header._read

    def peek(path, *a):
        seen.append(len(json.loads(cache.read_text())["entries"]) if cache.exists() else 0)
        return real(path, *a)

    monkeypatch.setattr(header, "_read", peek)
    M.scan([M.Root("folder", str(tmp_path / "mine"))], home=tmp_path, env={"SPECVIEW_CACHE": str(cache.parent.parent)})
    assert seen == [0, 0, 0, 3, 3, 3, 6, 6]
    assert len(json.loads(cache.read_text())["entries"]) == 8


# -- GGUFs that are not models ----------------------------------------------------------------------------------------


def _vocab_only(path: Path) -> Path:
    """A tokenizer and no tensors, cut where its header ends (as llama.cpp's models/ggml-vocab-*.gguf)."""
    import gguf as gguf_package

    from tinymodel import add_spm_vocab, vocab_tokens

    w = gguf_package.GGUFWriter(str(path), "llama")
    add_spm_vocab(w, *vocab_tokens())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    end = gguf.parse(data, len(data)).header_bytes
    path.write_bytes(data[:end])
    return path


def test_projectors_tensorless_files_and_vocabularies_are_not_models(tmp_path):
    top = tmp_path / "mine"
    clip = header_gguf(top / "vision-encoder.gguf", "clip", tensors={"v.patch_embd.weight": (16, 16)})
    vocab = _vocab_only(top / "ggml-vocab-llama-spm.gguf")
    good = tiny_gguf(top / "good.gguf")
    empty = top / "empty.gguf"
    empty.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 20) + b"general.architecture"
                      + struct.pack("<IQ", 8, 5) + b"llama")
    scan = within(20, M.scan, [M.Root("folder", str(top))], cache=False)
    why = _problems(scan)
    assert [Path(m.path) for m in scan.models] == [good]
    assert "multimodal projector (architecture clip)" in why[str(clip)]
    assert "vocabulary-only file" in why[str(vocab)] and "truncated" not in why[str(vocab)]
    assert "no tensors" in why[str(empty)]


def test_a_tokenizer_claiming_a_huge_token_id_is_refused_not_counted_to(tmp_path):
    """One token with id 2,000,000,000 would have the vocabulary's digest walk two billion ids."""
    folder = tiny_folder(tmp_path / "Huge-MLX")
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2_000_000_000}},
                                                       "added_tokens": []}))
    with pytest.raises(M.ModelHeaderError, match="token id 2000000000, beyond any real vocabulary"):
        within(20, M.read_header, folder)


def test_a_long_vocabulary_is_hashed_in_bounded_memory(tmp_path):
    """262,144 two-byte tokens (the largest real vocabularies' size): the reader holds one block of 256 at a time,
    not every string."""
    import tracemalloc

    n = 1 << 18
    key = b"tokenizer.ggml.tokens"
    p = tmp_path / "long.gguf"
    body = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, n)
    p.write_bytes(body + (struct.pack("<Q", 2) + b"ab") * n)
    tracemalloc.start()
    try:
        hd = within(60, gguf.read, p)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert hd.n_tokens == n and len(hd.vocab_blocks) == n // gguf.BLOCK
    assert peak < 3 << 20, f"{peak / 1e6:.1f} MB held while reading"
