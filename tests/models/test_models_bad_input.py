"""Bad input never stops a scan: each corrupt, truncated, missing, unreadable or looping thing is one Problem,
and a fuzz of GGUF headers never raises past the scanner."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specview.core import models as M
from specview.core.models import gguf
from stores import build_stores, tiny_folder, tiny_gguf


@pytest.fixture
def spoiled(tmp_path):
    """A home with every store, then one bad thing of each kind planted beside the good models."""
    s = build_stores(tmp_path / "home")
    lm = s.home / ".lmstudio" / "models" / "badpub"
    good = tiny_gguf(lm / "Fine-GGUF" / "fine.gguf")
    data = good.read_bytes()
    bad = {}
    bad["truncated"] = lm / "Cut-GGUF" / "cut.gguf"
    bad["truncated"].parent.mkdir(parents=True)
    bad["truncated"].write_bytes(data[:len(data) // 50])  # inside the vocabulary
    bad["corrupt"] = lm / "Noise-GGUF" / "noise.gguf"
    bad["corrupt"].parent.mkdir(parents=True)
    rnd = random.Random(1)
    bad["corrupt"].write_bytes(data[:24] + bytes(rnd.randrange(256) for _ in range(4000)))
    bad["not_a_model"] = lm / "Text-GGUF" / "readme.gguf"
    bad["not_a_model"].parent.mkdir(parents=True)
    bad["not_a_model"].write_text("this is not a model\n")
    # an ollama manifest naming a blob that is not there
    man = s.home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                           "digest": "sha256:" + "ab" * 32}]}))
    bad["missing_blob"] = man
    # a symlink loop: a folder linking to its parent, and a file linking to itself through another
    loopdir = lm / "Loop-GGUF"
    loopdir.mkdir()
    (loopdir / "again").symlink_to("..")
    bad["loop_dir"] = loopdir / "again" / "Loop-GGUF"  # reached a second time through the link
    (loopdir / "a.gguf").symlink_to("b.gguf")
    (loopdir / "b.gguf").symlink_to("a.gguf")
    bad["loop_file"] = loopdir / "a.gguf"
    # an unreadable folder (see test_an_unreadable_folder_is_a_problem: root ignores chmod)
    bad["broken_folder"] = tiny_folder(lm / "Broken-MLX")
    (bad["broken_folder"] / "config.json").write_text("{oops")
    return s, good, bad


def test_every_bad_input_is_one_problem_and_the_good_models_are_still_found(spoiled):
    s, good, bad = spoiled
    scan = M.scan(home=s.home, env=s.env(), cache=False)
    paths = [p.path for p in scan.problems]
    whys = {p.path: p.why for p in scan.problems}
    for key in ("truncated", "corrupt", "not_a_model", "missing_blob", "loop_file", "broken_folder"):
        assert paths.count(str(bad[key])) == 1, (key, scan.problems)
    assert "truncated" in whys[str(bad["truncated"])]
    assert "not a GGUF file" in whys[str(bad["not_a_model"])]
    assert "sha256:" + "ab" * 32 in whys[str(bad["missing_blob"])]
    assert "symlink loop" in whys[str(bad["loop_file"])]
    assert "config.json is not valid JSON" in whys[str(bad["broken_folder"])]
    assert any("symlink loop" in p.why and "again" in p.path for p in scan.problems)
    b_link = str(Path(bad["loop_file"]).with_name("b.gguf"))
    assert all(p.path.startswith(str(s.home)) for p in scan.problems)
    # nothing else went wrong: the planted problems (the looping folder, and b.gguf of the looping pair) only
    planted = {str(bad[k]) for k in bad if k != "loop_dir"} | {b_link}
    assert {p for p in paths if "again" not in p} == planted
    found = {Path(m.path) for m in scan.models}
    assert good in found
    assert {p for n, p in s.expected.items() if M.is_store_name(n)} <= found


def test_an_unreadable_folder_is_a_problem(spoiled, monkeypatch):
    """The tests run as root, whom chmod does not stop: an unreadable folder is simulated by an os.scandir
    that raises PermissionError for it, as the OS does for a folder without read permission."""
    s, good, _bad = spoiled
    locked = good.parent
    real = os.scandir

    def scandir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    scan = M.scan(home=s.home, env=s.env(), cache=False)
    mine = [p for p in scan.problems if p.path == str(locked)]
    assert len(mine) == 1 and "permission denied" in mine[0].why
    assert good not in {Path(m.path) for m in scan.models}
    assert s.expected["ollama:tiny:8b"] in {Path(m.path) for m in scan.models}


def test_a_folder_the_user_added_that_is_gone_is_a_problem(tmp_path):
    gone = tmp_path / "unplugged"
    scan = M.scan([M.Root("folder", str(gone))], cache=False)
    assert [(p.path, "not there" in p.why) for p in scan.problems] == [(str(gone), True)]


def test_read_header_names_the_file_on_a_bad_one(spoiled):
    _s, _good, bad = spoiled
    with pytest.raises(M.ModelHeaderError) as e:
        M.read_header(bad["truncated"])
    assert str(bad["truncated"]) in str(e.value) and e.value.path == str(bad["truncated"])
    with pytest.raises(M.ModelHeaderError, match="no such file|cannot be read"):
        M.read_header(bad["truncated"].with_name("nothing.gguf"))


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory):
    p = tiny_gguf(tmp_path_factory.mktemp("fuzz") / "t.gguf")
    data = p.read_bytes()
    return data, gguf.parse(data, len(data)).header_bytes


def test_a_gguf_truncated_anywhere_is_refused_cleanly(tiny_bytes):
    """Cut inside its header (at every offset) or inside its weights (an interrupted download): refused with a
    GGUFError, never another exception; whole, it reads, and its weights end exactly at the file's end."""
    data, header_end = tiny_bytes
    assert 1000 < header_end < len(data)
    for n in list(range(header_end)) + list(range(header_end, len(data), 997)) + list(range(len(data) - 8, len(data))):
        with pytest.raises(gguf.GGUFError):
            gguf.parse(data[:n], n)
    whole = gguf.parse(data, len(data))
    assert whole.data_end == len(data)


def test_the_tensor_type_sizes_are_ggmls(tiny_bytes):
    import gguf as gguf_package

    assert gguf.TYPE_SIZES == {int(k): tuple(v) for k, v in gguf_package.GGML_QUANT_SIZES.items()}


def test_truncated_files_through_read_header_raise_only_model_header_errors(tiny_bytes, tmp_path):
    data, header_end = tiny_bytes
    p = tmp_path / "cut.gguf"
    for n in list(range(0, 64)) + list(range(64, header_end, 97)):
        p.write_bytes(data[:n])
        with pytest.raises(M.ModelHeaderError):
            M.read_header(p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_bytes_in_the_metadata_never_raise_past_the_reader(tiny_bytes, data):
    raw, header_end = tiny_bytes
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(4, header_end - 1))
        buf[at] = data.draw(st.integers(0, 255))
    try:
        hd = gguf.parse(bytes(buf), len(buf))
    except gguf.GGUFError:
        return
    assert hd.header_bytes <= len(buf)


def test_a_fuzzed_store_never_stops_the_scan(tiny_bytes, tmp_path):
    raw, header_end = tiny_bytes
    rnd = random.Random(7)
    top = tmp_path / "f"
    top.mkdir()
    for i in range(40):
        buf = bytearray(raw[:rnd.randrange(header_end + 1)] if i % 2 else raw)
        for _ in range(rnd.randrange(1, 6)):
            if len(buf) > 8:
                buf[rnd.randrange(4, len(buf))] = rnd.randrange(256)
        (top / f"m{i}.gguf").write_bytes(bytes(buf))
    scan = M.scan([M.Root("folder", str(top))], cache=False)
    assert len(scan.models) + len(scan.problems) == 40
    assert all(not p.why.startswith("unexpected error") for p in scan.problems)


def test_arrays_nested_without_end_are_refused_not_recursed_into():
    import struct

    # GGUF v3, no tensors, one key whose value is an array of arrays of arrays ... 10,000 deep
    body = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
    body += struct.pack("<IQ", 9, 1) * 10_000
    with pytest.raises(gguf.GGUFError, match="nested deeper"):
        gguf.parse(body, len(body))
