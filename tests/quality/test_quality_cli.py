"""``specview quality`` end to end on an engine that knows the answers, and the report of its result."""

from __future__ import annotations

import json

import pytest

import oracle
from specview.cli import main
from specview.core.quality import RESULT_FILE, QualityResult, load_suite
from specview.core.report.write import write_report


def cli(name, tmp_path, *extra):
    return main(["quality", "--engine", name, "-m", "oracle", "-md", "oracle-draft", "-o", str(tmp_path), "-q",
                 *extra])


def test_no_changed_answer_exits_0_and_n_counts_items(tmp_path, capsys):
    oracle.register(load_suite("mixed", 12), name="oracle-cli")
    assert cli("oracle-cli", tmp_path, "--suite", "mixed", "-n", "6") == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    assert doc["n_items"] == 6 and doc["config"]["max_tokens"] == 64 and doc["table"]["both_pass"] == 6
    assert "vanilla pass" in out and "No outcome changed" in out and "passes 6 of 6" in out


def test_changed_answers_exit_1_with_their_forks_and_verdicts(tmp_path, capsys):
    suite = load_suite("mixed", 15)
    oracle.register(suite, name="oracle-cli-keep", fault="keep-rejected")
    assert cli("oracle-cli-keep", tmp_path, "--suite", "mixed", "-n", "15", "--max-tokens", "40") == 1
    out = capsys.readouterr().out
    res = QualityResult.load(tmp_path / RESULT_FILE)
    assert res.config["max_tokens"] == 40 and res.p_mcnemar < 0.05
    assert "Speculative decoding changed outcomes" in out and "outcomes that changed:" in out
    for o in res.discordant:
        assert o.item_id in out and "state bug" in out
    # the report says the same numbers
    written = write_report(tmp_path / RESULT_FILE, tmp_path / "report")
    md = written["markdown"].read_text()
    html = written["html"].read_text()
    t = res.table
    assert f"| vanilla passes | {t.both_pass} | {t.only_vanilla} | {t.both_pass + t.only_vanilla} |" in md
    assert "### Answers that changed" in md and all(o.item_id in md for o in res.discordant)
    assert "<h1>specview quality: mixed on oracle" in html and "Answers that changed" in html
    with pytest.raises(Exception, match="quality run; its report takes no kernel map"):
        write_report(tmp_path / RESULT_FILE, tmp_path / "r2", kernel_map=tmp_path / RESULT_FILE)


def test_a_code_suite_needs_execute(tmp_path, capsys):
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({"prompt": "def f():\n", "test": "assert f() == 1"}) + "\n")
    oracle.register(load_suite(str(p)), name="oracle-cli-code")
    assert cli("oracle-cli-code", tmp_path / "out", "--suite", str(p)) == 2
    assert "--execute" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_bad_suite_is_an_error_naming_it(tmp_path, capsys):
    oracle.register(load_suite("mixed", 1), name="oracle-cli-bad")
    assert cli("oracle-cli-bad", tmp_path, "--suite", "nonsense") == 2
    assert "--suite 'nonsense': not a suite" in capsys.readouterr().err


def test_the_report_escapes_what_the_suite_and_the_model_wrote(tmp_path):
    p = tmp_path / "hostile.jsonl"
    p.write_text(json.dumps({"id": "<script>x</script>|a", "prompt": "Say <b>", "answer": "<img src=x>"}) + "\n")
    suite = load_suite(str(p))
    oracle.register(suite, name="oracle-hostile", fault="keep-rejected")
    assert cli("oracle-hostile", tmp_path / "out", "--suite", str(p), "--max-tokens", "20") == 1
    written = write_report(tmp_path / "out" / RESULT_FILE, tmp_path / "report")
    html = written["html"].read_text()
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html
    md = written["markdown"].read_text()
    row = next(ln for ln in md.splitlines() if "only vanilla passes" in ln)
    assert row.count(" | ") == 8  # the item's | is escaped, so the row keeps its nine cells
