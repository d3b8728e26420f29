"""A probe in words: the table ``specview probe`` prints, and the Markdown report."""

from __future__ import annotations

import textwrap

from .result import ProbeReport, TriggerResult
from .scenarios import BY_NAME


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def table(report: ProbeReport, *, evidence: bool = True, width: int = 110) -> str:
    """One line per trigger and engine: trigger, variant, engine, result, and (indented below) its evidence."""
    head = f"{'trigger':<18} {'variant':<28} {'engine':<12} {'result':<16} tokens  fork"
    lines = [f"probe of {report.target}", head, "-" * len(head)]
    for r in report.rows:
        fork = "-" if r.first_mismatch is None else str(r.first_mismatch)
        lines.append(f"{r.trigger:<18} {_cell(r.label, 28):<28} {r.engine:<12} {r.result:<16} {r.n_tokens:>6}  {fork}")
        if evidence and r.evidence:
            lines.extend(textwrap.wrap(r.evidence, width, initial_indent="    ", subsequent_indent="    "))
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.seconds:
        lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items()))
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: ProbeReport) -> str:
    """The report: what each trigger recreates, then the table with every row's evidence."""
    out = [f"# specview probe: {_md(report.target)}", ""]
    out += ["| trigger | variant | engine | result | tokens | fork | evidence |", "|---|---|---|---|---|---|---|"]
    for r in report.rows:
        fork = "" if r.first_mismatch is None else str(r.first_mismatch)
        out.append(f"| {r.trigger} | {_md(r.label)} | {r.engine} | **{r.result}** | {r.n_tokens} | {fork} | "
                   f"{_md(r.evidence)} |")
    out += ["", "## The triggers", ""]
    for name in dict.fromkeys(r.trigger for r in report.rows):
        t = BY_NAME.get(name)
        if t is not None:
            out.append(f"- **{t.name}**: {t.title} ({t.report}). In-process: {t.in_process}. "
                       f"llama-server: {t.server}.")
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {_md(n)}" for n in report.notes]
    if report.seconds:
        out += ["", "Run time: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())]
    return "\n".join(out) + "\n"


def row_text(r: TriggerResult) -> str:
    """One row as one line (the app's status line, a log)."""
    return f"{r.trigger} ({r.label}, {r.engine}): {r.result} — {r.evidence}"
