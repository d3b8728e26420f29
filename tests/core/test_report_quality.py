"""The report of one run whose prompt came from a task suite says whether the answer changed, with the expected
answer and each arm's; the report of any other run says nothing of answers."""

from __future__ import annotations

from specview.core.arms.compare import compare_arms
from specview.core.report import trace_html, trace_markdown
from specview.core.report.quality import answer_line, quality_rows
from specview.core.trace import ArmResult, Step, Trace


def _arm(name: str, text: str) -> ArmResult:
    steps = [Step(index=i, token=ord(ch), piece=ch, pos=4 + i, top_ids=[ord(ch), 0], top_logits=[1.0, 0.9],
                  margin=0.1) for i, ch in enumerate(text)]
    return ArmResult(name=name, tokens=[s.token for s in steps], steps=steps, text=text, gen_ms=10.0,
                     stop_reason="eos", drafter=None if name == "vanilla" else "x")


def trace(v: str, s: str, quality: dict | None) -> Trace:
    va, sa = _arm("vanilla", v), _arm("speculative", s)
    cfg = {"target": "t.gguf", "draft": "d.gguf", "spec_type": "draft-simple", "n_max": 3, "n_min": 0, "p_min": 0.0,
           "max_tokens": 32, "chat": True, "engine": {"threads": 1}}
    if quality is not None:
        cfg["quality"] = quality
    return Trace(config=cfg, environment={"specview": "test"}, models={"target": {"file": "t.gguf"}},
                 prompt={"text": "What is 31 * 31?", "chat": True, "tokens": [1, 2]},
                 vanilla=va, speculative=sa, comparison=compare_arms(va, sa))


def block(v_pass: bool, s_pass: bool, v_got: str, s_got: str) -> dict:
    return {"suite": "arithmetic", "item": "arithmetic-0003", "expected": "961", "vanilla_pass": v_pass,
            "speculative_pass": s_pass, "vanilla_got": v_got, "speculative_got": s_got}


def test_a_changed_answer_is_said_with_the_expected_answer_and_both_arms():
    t = trace("The answer is 961.", "The answer is 951.", block(True, False, "961", "951"))
    rows = dict(quality_rows(t))
    assert rows["answer changed"] == "yes: vanilla passes, speculative fails"
    assert rows["expected answer"] == "'961'"
    assert rows["vanilla answer"] == "'961' (pass)" and rows["speculative answer"] == "'951' (fail)"
    assert rows["suite / item"] == "arithmetic / arithmetic-0003"
    for report in (trace_markdown(t, {}), trace_html(t, {})):
        assert "Task outcome" in report and "yes: vanilla passes, speculative fails" in report
        assert "951" in report and "arithmetic-0003" in report
    assert answer_line(t).startswith("answer changed: yes")


def test_a_fork_that_keeps_the_outcome_says_no_and_a_run_outside_a_suite_says_nothing():
    same = trace("It is 961.", "The answer is 961.", block(True, True, "961", "961"))
    assert dict(quality_rows(same))["answer changed"] == "no: both arms pass"
    wrong = trace("It is 960.", "It is 951.", block(False, False, "960", "951"))
    assert dict(quality_rows(wrong))["answer changed"] == "no: both arms fail, with different answers"
    same_wrong = trace("It is 960.", "Well, 960.", block(False, False, "960", "960"))
    assert dict(quality_rows(same_wrong))["answer changed"] == "no: both arms fail"
    plain = trace("The answer is 961.", "The answer is 951.", None)
    assert quality_rows(plain) == [] and answer_line(plain) is None
    for report in (trace_markdown(plain, {}), trace_html(plain, {})):
        assert "Task outcome" not in report and "answer changed" not in report
    # a block that does not say both arms' outcomes is no task outcome (a hand-edited or foreign trace)
    assert quality_rows(trace("a", "b", {"suite": "x", "vanilla_pass": "yes"})) == []
