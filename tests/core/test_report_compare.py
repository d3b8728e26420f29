"""``specview compare``: two traces of one prompt from two machines; refuses different prompts."""

from __future__ import annotations

import json
from pathlib import Path

from test_report import hostile_trace

from specview import cli
from specview.commands.compare import compare_traces
from specview.core.arms.compare import compare_arms


def _save(t, path: Path) -> str:
    t.save(path)
    return str(path)


def test_same_traces_exit_0(tmp_path: Path, capsys):
    a = _save(hostile_trace(), tmp_path / "a.json")
    b = _save(hostile_trace(), tmp_path / "b.json")
    assert cli.main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "vanilla      SAME" in out and "speculative  SAME" in out and "settings: the same" in out


def test_a_different_speculative_arm_is_located(tmp_path: Path, capsys):
    ta, tb = hostile_trace(), hostile_trace()
    tb.speculative.tokens[11] = 555
    tb.speculative.steps[11].token = 555
    tb.speculative.steps[11].piece = " other"
    tb.comparison = compare_arms(tb.vanilla, tb.speculative)
    tb.environment["cpu"] = "Other CPU"
    tb.config["engine"]["flash_attn"] = "on"
    res = compare_traces(ta, tb)
    assert res["vanilla"]["same"] and not res["speculative"]["same"]
    assert res["speculative"]["index"] == 11 and res["speculative"]["b_token"] == 555
    assert ("engine.flash_attn", "off", "on") in res["config"]
    assert any(k == "cpu" for k, _, _ in res["environment"])
    rc = cli.main(["compare", _save(ta, tmp_path / "a.json"), _save(tb, tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "speculative  DIFFERENT from token 11" in out and "' other'" in out
    assert "engine.flash_attn" in out


def test_a_shorter_run_cut_by_max_tokens_is_compared_on_its_length():
    ta, tb = hostile_trace(n=16), hostile_trace(n=12)
    res = compare_traces(ta, tb)
    assert res["vanilla"]["same"] and res["vanilla"]["compared"] == 12


def test_different_prompts_are_refused(tmp_path: Path, capsys):
    ta, tb = hostile_trace(), hostile_trace()
    tb.prompt = dict(tb.prompt, tokens=[1, 2, 9, 4])
    rc = cli.main(["compare", _save(ta, tmp_path / "a.json"), _save(tb, tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "different prompts" in err and "prompt token 2" in err and "Traceback" not in err


def test_unreadable_input_is_refused(tmp_path: Path, capsys):
    a = _save(hostile_trace(), tmp_path / "a.json")
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"schema": "specview.matrix/1", "cells": []}))
    assert cli.main(["compare", a, str(bad)]) == 2
    assert "not a specview trace" in capsys.readouterr().err
    assert cli.main(["compare", a, str(tmp_path / "nope.json")]) == 2
