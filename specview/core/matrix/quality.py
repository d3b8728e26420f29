"""A matrix over a task suite: every cell's two answers scored, and per setting whether speculation changed them.

``specview matrix --suite NAME`` with the name of a task suite
(:data:`specview.core.quality.SUITE_NAMES`, or a ``.jsonl`` file; a list of
prompt-suite categories keeps its meaning) makes each suite item a prompt of
the matrix, named by the item's id.  Each finished cell scores both arms'
texts against its item with :func:`specview.core.quality.score` (once when the
arms are identical) and records a ``quality`` block: in the cell record, and
in the cell's trace config (the block ``specview quality`` writes, so the fork
card and the report of an opened cell say whether the answer changed).

Per setting, :func:`answers` counts the paired outcomes over its items (both
pass, both fail, only vanilla, only speculative) with McNemar's exact p on
the discordant ones: ``answers: 18 same / 1 changed (p=1.00)``.  Cells stop
neither arm early: an answer is scored on the whole text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..prompts import PromptSpec
from .spec import MatrixError, check_block

#: the paired outcomes, in the order a 2x2 table reads them
OUTCOMES = ("both_pass", "both_fail", "only_vanilla", "only_speculative")


def is_task_suite(value: str) -> bool:
    """Whether ``--suite VALUE`` names a task suite (a suite name, or a ``.jsonl`` file), not prompt categories."""
    from ..quality import SUITE_NAMES

    return value in SUITE_NAMES or value.lower().endswith(".jsonl")


def suite_block(name: str, items: int | None = None, seed: int = 0, execute: bool = False) -> dict[str, Any]:
    """A matrix spec's ``quality`` block: which task suite (its name or file), how many items, the seed, and
    whether scoring may run model-written code."""
    block = {"suite": name, "items": items, "seed": seed, "execute": execute}
    check_block(block, "--suite")
    return block


def load_items(block: Mapping[str, Any]) -> Any:
    """The :class:`~specview.core.quality.Suite` a ``quality`` block names; a MatrixError naming the suite."""
    from ..quality import QualityError, load_suite

    try:
        return load_suite(block["suite"], n=block.get("items"), seed=int(block.get("seed") or 0))
    except QualityError as exc:
        raise MatrixError(f"--suite {block['suite']}: {exc}") from None


def task_prompts(suite: Any, *, chat: bool = True) -> list[PromptSpec]:
    """One prompt per item of ``suite`` (the text ``specview quality`` sends for it), named by the item's id and
    tagged with the suite's name."""
    from ..quality.score import prompt_for

    return [PromptSpec(name=it.id, text=prompt_for(it, chat), chat=chat, category=suite.name) for it in suite.items]


def task_suite(spec: Any) -> Any:
    """The task suite of a matrix over one (None for any other), its items checked against the matrix's prompts;
    refused, naming ``--execute``, when scoring would run code the spec does not allow."""
    block = getattr(spec, "quality", None)
    if not block:
        return None
    if getattr(spec, "stop_after_fork", None) is not None:
        raise MatrixError(f"--suite {block['suite']}: an answer is scored on the whole text, so a cell over a task "
                          "suite cannot stop its speculative arm after the fork: drop --stop-after-fork")
    suite = load_items(block)
    if suite.needs_execute and not block.get("execute"):
        raise MatrixError(f"--suite {block['suite']}: scoring its items runs model-written code; give --execute to "
                          "run it in the sandbox (docs/quality.md says what the sandbox enforces)")
    ids = {it.id for it in suite.items}
    missing = [p.name for p in spec.prompts if p.name not in ids]
    if missing:
        raise MatrixError(f"the matrix's prompt {missing[0]!r} is no item of the task suite {block['suite']}: a "
                          "matrix over a task suite runs only its items")
    return suite


def score_cell(item: Any, trace: Any, block: Mapping[str, Any], suite_name: str) -> dict[str, Any]:
    """Score both arms of ``trace`` against ``item``; write the trace config's ``quality`` block and return the
    cell's (the same, with each arm's reason)."""
    from ..quality import QUALITY_KEY, score

    execute, limits = bool(block.get("execute")), None
    v = score(item, trace.vanilla.text, execute=execute, limits=limits)
    same = trace.comparison.identical or trace.speculative.text == trace.vanilla.text
    s = v if same else score(item, trace.speculative.text, execute=execute, limits=limits)
    q = {"suite": suite_name, "item": item.id, "expected": item.expected,
         "vanilla_pass": bool(v.passed), "speculative_pass": bool(s.passed),
         "vanilla_got": v.got, "speculative_got": s.got}
    if isinstance(trace.config, dict):
        trace.config[QUALITY_KEY] = dict(q)
    out = {**q, "vanilla_why": v.why, "speculative_why": s.why}
    if v.error or s.error:  # an answer that could not be judged (its pattern ran out of time) is not scored
        out["error"] = f"the answer could not be judged: {v.error or s.error}"
    return out


def outcome(q: Mapping[str, Any]) -> str:
    """A cell's paired outcome: ``both_pass``, ``both_fail``, ``only_vanilla`` or ``only_speculative``."""
    v, s = bool(q.get("vanilla_pass")), bool(q.get("speculative_pass"))
    return "both_pass" if v and s else "both_fail" if not (v or s) else "only_vanilla" if v else "only_speculative"


def scored(cell: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished cell's ``quality`` block, or None (a cell not scored, or failed)."""
    q = cell.get("quality")
    ok = cell.get("status") == "ok" and isinstance(q, dict) and not q.get("error")
    return q if ok and isinstance(q.get("vanilla_pass"), bool) and isinstance(q.get("speculative_pass"), bool) else None


def answer_changed(cell: Mapping[str, Any]) -> bool | None:
    """Whether one arm of a scored cell passed and the other failed (None for a cell not scored)."""
    q = scored(cell)
    return None if q is None else q["vanilla_pass"] != q["speculative_pass"]


def answers(cells: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The paired outcomes of the scored ``cells`` (one setting's): the 2x2 counts, ``same`` and ``changed``,
    McNemar's exact p on the discordant cells, and how many changed with a state-bug fork; None if none scored."""
    from ..quality import mcnemar_exact

    counts = dict.fromkeys(OUTCOMES, 0)
    state = 0
    for c in cells:
        q = scored(c)
        if q is None:
            continue
        k = outcome(q)
        counts[k] += 1
        state += k.startswith("only_") and c.get("verdict") == "state"
    n = sum(counts.values())
    if not n:
        return None
    changed = counts["only_vanilla"] + counts["only_speculative"]
    return {**counts, "n": n, "same": n - changed, "changed": changed, "changed_state": state,
            "p": mcnemar_exact(counts["only_vanilla"], counts["only_speculative"])}


def answers_text(a: Mapping[str, Any] | None) -> str:
    """``answers: 18 same / 1 changed (p=1.00)``, and the changes that came with a state-bug fork ("" if none)."""
    from ..quality.text import p_text

    if not a:
        return ""
    out = f"answers: {a['same']} same / {a['changed']} changed (p={p_text(a['p'])})"
    if a["changed"]:
        out += f" [{a['only_vanilla']} only vanilla passes, {a['only_speculative']} only speculative]"
    if a["changed_state"]:
        out += f"; {a['changed_state']} changed at a STATE fork"
    return out


def cell_mark(cell: Mapping[str, Any]) -> str:
    """What a grid cell adds: ``answer changed`` (``ANSWER CHANGED`` at a state fork), ``answer same``, or ""."""
    ch = answer_changed(cell)
    if ch is None:
        return ""
    if not ch:
        return "answer same"
    return "ANSWER CHANGED" if cell.get("verdict") == "state" else "answer changed"


def suite_label(block: Mapping[str, Any]) -> str:
    """``arithmetic (20 items, seed 0)`` or a file's name."""
    name = str(block.get("suite"))
    label = Path(name).name if name.lower().endswith(".jsonl") else name
    n = f"{block['items']} items, " if isinstance(block.get("items"), int) else ""
    return f"{label} ({n}seed {block.get('seed') or 0})"


__all__ = ["OUTCOMES", "answer_changed", "answers", "answers_text", "cell_mark", "check_block", "is_task_suite",
           "load_items", "outcome", "score_cell", "scored", "suite_block", "suite_label", "task_suite",
           "task_prompts"]
