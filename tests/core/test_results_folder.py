"""Where the app keeps the matrices and quality runs it starts: a folder of the user's that outlives the app."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specview.core.errors import SpecviewError
from specview.core.paths import new_results_folder, results_dir


def test_results_go_under_specview_results_one_new_folder_a_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECVIEW_RESULTS", str(tmp_path / "r"))
    assert results_dir() == tmp_path / "r"
    a = new_results_folder("matrix", "lfm2-draft")
    b = new_results_folder("matrix", "lfm2-draft")
    q = new_results_folder("quality", "arithmetic")
    assert a != b and a.parent == b.parent == tmp_path / "r" / "matrix" and q.parent == tmp_path / "r" / "quality"
    assert a.is_dir() and b.is_dir() and not any(a.iterdir())
    # <UTC time>-<label>-<unique>: listed by name, the runs come in the order they started
    assert re.fullmatch(r"\d{8}-\d{6}-lfm2-draft-.+", a.name), a.name
    assert re.fullmatch(r"\d{8}-\d{6}-arithmetic-.+", q.name), q.name


def test_a_label_becomes_a_plain_file_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECVIEW_RESULTS", str(tmp_path))
    odd = new_results_folder("quality", "../my suite/v2: *final*")
    assert odd.parent == tmp_path / "quality"
    assert re.fullmatch(r"\d{8}-\d{6}-my-suite-v2-final-.+", odd.name), odd.name
    bare = new_results_folder("matrix")
    assert re.fullmatch(r"\d{8}-\d{6}-[^-].*", bare.name) and bare.parent == tmp_path / "matrix"


def test_without_the_variable_results_live_in_the_users_data_folder(monkeypatch) -> None:
    from platformdirs import user_data_dir

    monkeypatch.delenv("SPECVIEW_RESULTS", raising=False)
    assert results_dir() == Path(user_data_dir("specview", appauthor=False)) / "results"


def test_a_folder_that_cannot_be_made_is_an_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "results"
    blocked.write_text("a file where the folder should be\n")
    monkeypatch.setenv("SPECVIEW_RESULTS", str(blocked))
    with pytest.raises(SpecviewError) as exc:
        new_results_folder("matrix", "x")
    msg = str(exc.value)
    assert f"cannot make a results folder in {blocked / 'matrix'}" in msg
    assert "$SPECVIEW_RESULTS" in msg
