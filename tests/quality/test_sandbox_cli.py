"""``specview quality --execute`` says what the sandbox enforces before anything runs, records it in quality.json
and its report, and refuses a machine that lacks a promised fence unless told ``--allow-weak-sandbox``; the docs
and the README list the same promised fences the CLI checks."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import oracle
from sandbox_here import weak_flag
from specview.cli import main
from specview.core.quality import RESULT_FILE, load_suite
from specview.core.quality import execute
from specview.core.quality.execute import PROMISED, Limits, SandboxReport, run_sample, sandbox_report
from specview.core.report.write import write_report

ROOT = Path(__file__).resolve().parents[2]


def code_suite(tmp_path: Path, name: str) -> Path:
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({"prompt": "def f():\n", "test": "assert f() == 1"}) + "\n")
    oracle.register(load_suite(str(p)), name=name, reply=lambda it: "    return 1\n")
    return p


def cli(name: str, suite: Path, out: Path, *extra: str) -> int:
    return main(["quality", "--engine", name, "-m", "oracle", "-md", "oracle-draft", "--suite", str(suite),
                 "--execute", "-o", str(out), "-q", *extra])


def test_execute_prints_and_records_what_the_sandbox_enforces(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite = code_suite(tmp_path, "oracle-sandbox-cli")
    flag = weak_flag()
    assert cli("oracle-sandbox-cli", suite, tmp_path / "out", *flag) == 0
    err = capsys.readouterr().err
    report = sandbox_report()
    assert report.text() in err  # even with -q: it is what the user agreed to
    doc = json.loads((tmp_path / "out" / RESULT_FILE).read_text())
    assert doc["table"]["both_pass"] == 1
    assert doc["sandbox"] == report.to_dict(allowed_weak=bool(flag))
    assert doc["sandbox"]["enforced"][0].startswith("network: ")
    md = write_report(tmp_path / "out" / RESULT_FILE, tmp_path / "report")["markdown"].read_text()
    assert "sandbox the code ran in" in md
    for line in report.lines():
        fence = line.split(": ", 1)[0]
        assert f"| {fence} |" in md, fence


def _weak_report() -> SandboxReport:
    """A real probe with the kernel's fences left out: what a machine without them reports."""
    res = run_sample("pass\n", limits=Limits(), guard=False, probe=True,
                     fences_off=("namespaces", "mounts", "landlock", "seccomp"))
    assert res.passed and res.fences is not None, res
    return SandboxReport(fences=res.fences, limits=Limits(), python="python")


def test_a_machine_without_a_promised_fence_is_refused_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    weak = _weak_report()
    missing = weak.missing()
    assert missing  # no Landlock and no seccomp: writes and Unix sockets at least
    assert any(m.startswith("no Unix socket") for m in missing) and any(m.startswith("writes only") for m in missing)
    monkeypatch.setitem(execute._REPORTS, Limits(), weak)
    suite = code_suite(tmp_path, "oracle-sandbox-weak")
    assert cli("oracle-sandbox-weak", suite, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "--allow-weak-sandbox" in err and all(m in err for m in missing)
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written
    assert cli("oracle-sandbox-weak", suite, tmp_path / "out", "--allow-weak-sandbox") == 0
    err = capsys.readouterr().err
    assert "running model-written code without: " + "; ".join(missing) in err
    doc = json.loads((tmp_path / "out" / RESULT_FILE).read_text())
    assert doc["sandbox"]["allowed_weak"] is True and doc["sandbox"]["missing"] == missing
    md = write_report(tmp_path / "out" / RESULT_FILE, tmp_path / "report")["markdown"].read_text()
    assert "run with --allow-weak-sandbox, without" in md


def _promised_list(text: str, where: str) -> list[str]:
    """The bullets between the ``<!-- promised fences -->`` markers of a document."""
    m = re.search(r"<!-- promised fences -->\n(.*?)<!-- /promised fences -->", text, re.S)
    assert m, f"{where} has no promised-fences list"
    return [line[2:].strip() for line in m.group(1).splitlines() if line.startswith("- ")]


@pytest.mark.parametrize("doc", ["docs/quality-sandbox.md", "README.md"])
def test_the_docs_promise_the_fences_the_cli_checks(doc: str) -> None:
    assert _promised_list((ROOT / doc).read_text(encoding="utf-8"), doc) == [words for _, words in PROMISED]


def test_the_docs_name_every_gap_the_report_can_give() -> None:
    """Every gap sentence the report can print (each fence left out in turn) is in docs/quality-sandbox.md."""
    text = (ROOT / "docs/quality-sandbox.md").read_text(encoding="utf-8")
    weak = _weak_report()
    for gap in weak.gaps():
        head = gap.split(" (")[0].split(":")[0]
        assert head in text, gap


def test_a_completion_that_reaches_a_unix_socket_fails_through_the_cli(tmp_path: Path) -> None:
    """The issue's case end to end: a model's completion connecting to a listener outside is a fail, and the
    listener gets nothing."""
    from test_sandbox_attacks import Listener

    if not sandbox_report().fences.unix_denied:
        pytest.skip("Unix sockets are not denied on this platform (sandbox_report says so: a gap, not a pass)")
    folder = Path.home() / f".specview-cli-attack-{tmp_path.name[-8:]}"
    folder.mkdir(mode=0o700)
    path = str(folder / "bus")
    listener = Listener(path, 0o666)
    try:
        p = tmp_path / "code.jsonl"
        p.write_text(json.dumps({"prompt": "def f():\n", "test": "assert f() == 1"}) + "\n")
        reply = (f"    import socket\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({path!r})\n"
                 "    s.sendall(b'reached')\n    return 1\n")
        oracle.register(load_suite(str(p)), name="oracle-sandbox-unix", reply=lambda it: reply)
        assert cli("oracle-sandbox-unix", p, tmp_path / "out", *weak_flag()) == 0  # both arms fail alike
    finally:
        got = listener.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert got == []
    doc = json.loads((tmp_path / "out" / RESULT_FILE).read_text())
    item = doc["items"][0]
    assert item["outcome"] == "both-fail" and "network" in item["vanilla"]["why"], item
