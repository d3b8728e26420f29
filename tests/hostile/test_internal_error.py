"""An exception specview did not expect is a bug: one line, its own exit status, the traceback kept in a file.

Exit status 1 means "the arms diverged" (``run``, ``matrix``, ``compare``) or "an outcome changed"
(``quality``); Python's own status for an uncaught exception is also 1, so a bug would read as a result.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specview import cli


@pytest.fixture()
def broken_compare(monkeypatch, tmp_path):
    """``specview compare`` whose code raises what no SpecviewError handler expects (a bug)."""
    from specview.commands import compare

    def bug(args):
        raise ValueError("could not convert string to float: 'x'\n(second line)")

    monkeypatch.setattr(compare, "main", bug)
    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    return tmp_path


def test_a_bug_exits_70_with_one_line_and_the_traceback_in_a_file(broken_compare, capsys):
    assert cli.main(["compare", "a.json", "b.json"]) == cli.EXIT_INTERNAL == 70
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    line = lines[0]
    assert line.startswith("specview: internal error (a bug in specview, please report it): ValueError: could not "
                           "convert string to float: 'x' (second line); the traceback is in ")
    saved = Path(line.rsplit("the traceback is in ", 1)[1])
    assert saved.parent == broken_compare / "cache" / "errors" and saved.is_file()
    text = saved.read_text()
    assert "specview compare a.json b.json" in text and "Traceback (most recent call last)" in text
    assert "in bug" in text and "ValueError: could not convert string to float" in text


def test_with_the_debug_variable_the_traceback_is_printed_too(broken_compare, capsys, monkeypatch):
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(["compare", "a.json", "b.json"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith(
        "specview: internal error")


def test_with_nowhere_to_write_it_the_line_says_how_to_see_it(broken_compare, capsys, monkeypatch):
    blocker = broken_compare / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECVIEW_CACHE", str(blocker / "cache"))  # a folder inside a file: cannot be made
    assert cli.main(["compare", "a.json", "b.json"]) == 70
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"; rerun with {cli.DEBUG_ENV}=1 to see the traceback") and len(err.splitlines()) == 1


def test_errors_and_results_keep_their_statuses(tmp_path, capsys):
    # a SpecviewError stays 2, and only interrupts are 130: the catch-all is for what nothing else names
    assert cli.main(["compare", str(tmp_path / "absent.json"), str(tmp_path / "absent.json")]) == 2
    assert "specview: error: " in capsys.readouterr().err
