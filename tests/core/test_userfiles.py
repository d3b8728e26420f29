"""Files a user names (a prompt, a trace, a matrix spec): what they are is checked before a byte is read, and the
read is bounded, so a FIFO, a device or a model given by mistake is an error naming it, never a hang or a machine
out of memory."""

import os
import stat
import threading

import pytest

from specview.cli import main
from specview.core import jsonfile, prompts, userfiles
from specview.core.errors import SpecviewError
from specview.core.jsonfile import read_json
from specview.core.prompts import PromptError, read_text_file, read_toml


def returns_within(seconds, fn, *args, **kw):
    """``fn(*args, **kw)``'s result or exception, or a failure when it is still waiting after ``seconds`` (a FIFO
    opened with no writer waits for ever: the thread is left to the end of the test process)."""
    box = {}

    def go():
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} was still waiting after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("read, what", [
    (read_json, "a JSON file"),
    (read_text_file, "a prompt file"),
    (read_toml, "a TOML file"),
])
def test_a_fifo_nobody_writes_is_refused_at_once(fifo, read, what):
    with pytest.raises(SpecviewError) as ei:
        returns_within(10, read, fifo)
    assert str(ei.value) == f"{fifo}: a FIFO (named pipe), not {what}; give a regular file"


def test_a_pipe_named_on_a_command_line_is_read(fifo):
    """``specview run -f <(...)`` hands specview a pipe its own shell writes: that one is read."""
    writer = threading.Thread(target=lambda: fifo.write_text("Once upon a time", encoding="utf-8"), daemon=True)
    writer.start()
    assert returns_within(10, read_text_file, fifo, pipes=True) == "Once upon a time"
    writer.join(10)


@pytest.mark.skipif(not os.path.exists("/dev/zero") or not stat.S_ISCHR(os.stat("/dev/zero").st_mode),
                    reason="no /dev/zero character device on this platform")
@pytest.mark.parametrize("pipes", [False, True])
def test_a_device_is_never_read_even_where_pipes_are(pipes):
    with pytest.raises(PromptError, match=r"^/dev/zero: a character device, not a prompt file; give a regular file$"):
        returns_within(10, read_text_file, "/dev/zero", pipes=pipes)


def test_a_gguf_model_given_where_text_goes_is_named_as_one(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    with pytest.raises(PromptError, match=r"model.gguf: a GGUF model file, not a prompt file$"):
        read_text_file(model)
    with pytest.raises(SpecviewError, match=r"model.gguf: a GGUF model file, not a JSON file$"):
        read_json(model)


def test_a_file_past_its_kind_s_bound_is_refused_after_reading_one_byte_more(tmp_path, monkeypatch):
    read = []
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def read(self, n):
            read.append(n)
            return self.fh.read(n)

    monkeypatch.setattr(userfiles, "open", lambda p, mode: Counting(real_open(p, mode)), raising=False)
    monkeypatch.setattr(prompts, "MAX_PROMPT_BYTES", 3 << 20)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * ((3 << 20) + 1))
    with pytest.raises(PromptError, match=r"big.txt: more than 3 MB; no prompt file specview reads is that large$"):
        read_text_file(big)
    assert read == [(3 << 20) + 1]
    big.write_bytes(b"a" * (3 << 20))  # exactly the bound is read
    assert len(read_text_file(big)) == 3 << 20

    monkeypatch.setattr(jsonfile, "MAX_JSON_BYTES", 10)
    (tmp_path / "t.json").write_text('{"schema": "specview.trace/1"}')
    with pytest.raises(SpecviewError, match=r"t.json: more than 10 bytes; no JSON file specview reads is that large$"):
        read_json(tmp_path / "t.json")


def test_not_utf8_names_the_byte(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(PromptError, match=r"latin1.txt: not UTF-8 text \(byte 3 is 0xe9\); save it as UTF-8$"):
        read_text_file(f)
    with pytest.raises(SpecviewError, match=r"latin1.txt: not UTF-8 text \(byte 3 is 0xe9\), so not a JSON file"):
        read_json(f)


def test_cli_prompt_file_errors_name_the_flag(capsys, tmp_path, fifo):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    for given, said in ((tmp_path, f"--prompt-file {tmp_path}: is a folder, not a prompt file"),
                        (model, f"--prompt-file {model}: a GGUF model file, not a prompt file")):
        assert main(["run", "-f", str(given), "-q"]) == 2
        assert capsys.readouterr().err.strip() == f"specview: error: {said}"


def test_cli_prompt_on_standard_input_is_bounded(capsys, monkeypatch):
    import io
    import sys

    from specview.commands import common

    monkeypatch.setattr(common, "MAX_PROMPT_BYTES", 1 << 20)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * ((1 << 20) + 1))))
    assert main(["run", "-f", "-", "-q"]) == 2
    assert capsys.readouterr().err.strip() == ("specview: error: --prompt-file -: more than 1 MB on standard input; "
                                               "no prompt is that large")


# -- the files specview writes ------------------------------------------------------------------------------------
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc: the folder that takes no files")


def test_a_full_disk_is_a_write_error_naming_the_file_and_the_old_file_stays(tmp_path, monkeypatch):
    import errno

    from specview.core.errors import WriteError
    from specview.core.jsonfile import write_atomic

    p = tmp_path / "t.json"
    write_atomic(p, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(jsonfile.os, "fsync", full)
    with pytest.raises(WriteError) as ei:
        write_atomic(p, "new")
    assert str(ei.value) == f"{p}: writing it failed ({os.strerror(errno.ENOSPC)}); the file is as it was"
    assert isinstance(ei.value, OSError)  # a cache that ignores a failed write as an OSError still does
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["t.json"]
    with pytest.raises(WriteError, match=r"new.json: writing it failed \(.*\); the file is not written$"):
        write_atomic(tmp_path / "new.json", "x")


@needs_proc
def test_an_output_folder_that_takes_no_files_is_refused_before_the_work(tmp_path, capsys):
    from specview.core.jsonfile import check_writable

    with pytest.raises(SpecviewError, match=r"^/proc/t.json: cannot write a file in /proc \(.+\); choose another folder$"):
        check_writable("/proc/t.json")
    with pytest.raises(SpecviewError, match=rf"^{tmp_path}: is a folder; name a file in it$"):
        check_writable(tmp_path)
    (tmp_path / "afile").write_text("")
    for under in (tmp_path / "afile" / "t.json", tmp_path / "afile" / "sub" / "t.json"):
        with pytest.raises(SpecviewError, match=rf"^{under}: {tmp_path / 'afile'} is a file, not a folder$"):
            check_writable(under)
    (tmp_path / "afile").unlink()
    assert check_writable(tmp_path / "t.json") == tmp_path / "t.json"
    assert list(tmp_path.iterdir()) == []  # the check leaves nothing

    # a target that does not exist: had a model been looked for first, the error would name it, not the output
    missing = ["-m", str(tmp_path / "no-such-model.gguf")]
    for argv, said in ((["run", "--json", "/proc/t.json"], "--json /proc/t.json: cannot write a file in /proc"),
                       (["run", "--json", str(tmp_path)], f"--json {tmp_path}: is a folder; name a file in it"),
                       (["matrix", "-o", "/proc/m.json", "-p", "hi", "--no-builtin-prompts"],
                        "-o /proc/m.json: cannot write a file in /proc"),
                       (["probe", "--json", str(tmp_path / "no" / "p.json")],
                        f"--json {tmp_path / 'no' / 'p.json'}: the folder {tmp_path / 'no'} does not exist")):
        assert main(argv + missing + ["-q"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"specview: error: {said}"), err


@needs_proc
def test_a_report_into_a_folder_that_takes_no_files_is_refused_before_any_plot(tmp_path):
    from fakes import FakeBackend
    from specview.core.registry import get_backend, register_backend
    from specview.core.report.write import write_report
    from specview.core.session import RunConfig, Session

    register_backend("fake", FakeBackend)
    get_backend("fake")
    trace = Session().run(RunConfig(backend="fake", target="0", draft="0:3.0", prompt="hello world", max_tokens=20,
                                    ignore_eos=True, n_max=4))
    drawn = []
    with pytest.raises(SpecviewError, match=r"^-o /proc: cannot write files in this folder \(.+\); choose another$"):
        write_report(trace, "/proc", plots=lambda t: drawn.append(t) or {})
    assert drawn == []


def test_choosing_how_to_open_a_fifo_does_not_open_it(fifo):
    """The app's tabs ask :func:`declares_schema` which view opens a file before reading it: a FIFO is no
    specview file, said at once (its read then names it), where opening it would wait for a writer."""
    from specview.core.jsonfile import declares_schema

    assert returns_within(10, declares_schema, fifo, "specview.trace") is False
