"""A run whose prompt came from a task suite: whether the fork changed the answer, in a report and on the fork card.

``specview quality`` (and a matrix over a task suite) records in each run's
trace, in its config, a ``quality`` block: the suite, the item, the expected
answer, whether each arm's reply passed and, where recorded, what was read
from each reply (``vanilla_got`` / ``speculative_got``).  A trace without the
block (any other run) gets nothing from here.
"""

from __future__ import annotations

from typing import Any

from .escape import text
from .facts import obj


def quality_block(trace: Any) -> dict[str, Any] | None:
    """The trace's ``quality`` block when its prompt came from a task suite and both arms were scored, or None."""
    from ..quality import quality_block as block

    q = obj(block(trace))
    return q if isinstance(q.get("vanilla_pass"), bool) and isinstance(q.get("speculative_pass"), bool) else None


def changed(trace: Any) -> bool | None:
    """Whether the answer changed between the arms (one passed, the other failed); None without the block."""
    from ..quality import answer_changed

    return answer_changed(trace) if quality_block(trace) is not None else None


def _passed(ok: bool) -> str:
    return "pass" if ok else "fail"


def _answer(q: dict[str, Any], arm: str) -> str:
    got = q.get(f"{arm}_got")
    return f"{text(got)!r} ({_passed(q[f'{arm}_pass'])})" if isinstance(got, str) else _passed(q[f"{arm}_pass"])


def outcome_words(trace: Any) -> str | None:
    """``yes: vanilla passes, speculative fails`` / ``no: both arms pass`` (None without the block)."""
    q = quality_block(trace)
    if q is None:
        return None
    v, s = q["vanilla_pass"], q["speculative_pass"]
    if changed(trace):
        return f"yes: vanilla {'passes' if v else 'fails'}, speculative {'passes' if s else 'fails'}"
    if v != s:
        return "no"
    gv, gs = q.get("vanilla_got"), q.get("speculative_got")
    other = isinstance(gv, str) and isinstance(gs, str) and gv != gs  # the fork changed what was read, not the score
    return f"no: both arms {'pass' if v else 'fail'}" + (", with different answers" if other else "")


def quality_rows(trace: Any) -> list[tuple[str, str]]:
    """(label, value) rows of the task outcome: answer changed, the suite and item, the expected answer and each
    arm's; [] for a run whose prompt did not come from a suite."""
    q = quality_block(trace)
    if q is None:
        return []
    return [("answer changed", text(outcome_words(trace))),
            ("suite / item", f"{text(q.get('suite')) or '?'} / {text(q.get('item')) or '?'}"),
            ("expected answer", repr(text(q.get("expected"))) if q.get("expected") is not None else "n/a (a test)"),
            ("vanilla answer", _answer(q, "vanilla")),
            ("speculative answer", _answer(q, "speculative"))]


def answer_line(trace: Any) -> str | None:
    """One line for the fork card: ``answer changed: yes: ... · expected '945' · vanilla '945' (pass) ...``."""
    rows = quality_rows(trace)
    if not rows:
        return None
    d = dict(rows)
    return (f"answer changed: {d['answer changed']} · {d['suite / item']} · expected {d['expected answer']} · "
            f"vanilla {d['vanilla answer']} · speculative {d['speculative answer']}")


def sandbox_rows(sandbox: Any) -> list[tuple[str, str]]:
    """(fence, what held) rows of a quality result's ``sandbox`` record (what ``specview quality --execute``
    printed before it ran), then each gap as ``NOT enforced``; [] where no code ran."""
    rec = obj(sandbox)
    rows = []
    for line in rec.get("enforced") if isinstance(rec.get("enforced"), list) else []:
        fence, _, what = text(line).partition(": ")
        rows.append((fence, what) if what else ("", fence))
    rows += [("NOT enforced", text(g)) for g in (rec.get("gaps") if isinstance(rec.get("gaps"), list) else [])]
    missing = rec.get("missing") if isinstance(rec.get("missing"), list) else []
    if missing:
        said = "run with --allow-weak-sandbox" if rec.get("allowed_weak") is True else "run"
        rows.append((f"{said}, without", "; ".join(text(m) for m in missing)))
    return rows


def near_tie_table(result: Any) -> tuple[tuple[str, ...], list[tuple[str, ...]], str] | None:
    """(headers, rows, what was counted) of a quality result's near-tie density: per band each arm's near-tie steps
    with their Wilson interval, and of the items that forked (whose answer changed) how many forked at a near-tie;
    None where no item carries counts."""
    from ..quality.near_ties import TABLE_HEADERS, intro, table_rows

    summary = getattr(result, "near_ties", None)
    if not isinstance(summary, dict) or not summary.get("items"):
        return None
    return TABLE_HEADERS, table_rows(summary), intro(summary)


__all__ = ["answer_line", "changed", "near_tie_table", "outcome_words", "quality_block", "quality_rows",
           "sandbox_rows"]
