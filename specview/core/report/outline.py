"""What each report says, in what order: the sections both writers walk.

A report is a list of :class:`Section`\\ s, each of a ``kind`` a writer knows how
to draw (:class:`specview.core.report.html.HtmlWriter`,
:class:`specview.core.report.markdown.MarkdownWriter`), with its heading and
what it holds, already as rows, tables and sentences.  The order, the headings,
which sections a report has and what they hold are said here once; a writer adds
its opening and closing and draws each kind, escaping every field, its own way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection

from ..verdicts import category
from ..models.record import rerun_command
from .facts import (PLOT_CAPTIONS, acceptance_facts, backend_warning, commands, config_facts, crash_warning,
                    earliest_fork, environment_facts, fmt, fork_context, model_facts, obj, preset_command,
                    prompt_block, quoted, spec_rows, verdict_facts)
from .kernels import LEGEND, WIDTH_HEADERS, heat_cell, map_intro, target_facts, width_rows
from .quality import quality_rows


@dataclass(frozen=True)
class Section:
    """One part of a report: ``kind`` says how a writer draws ``body``; ``title`` is its heading ("" for none)."""

    kind: str
    body: Any = None
    title: str = ""
    #: the Markdown report gathers its folded sections in one collapsed block, each table under ``head``
    folded: bool = False
    head: tuple[str, str] = ("", "")
    #: False for a section only the HTML report has
    markdown: bool = True


def plot_sections(plots: Collection[str]) -> list[Section]:
    """A section for each plot the report was given (``plots``: their names), in the order of the captions."""
    return [Section("plot", (key, caption), title) for key, (title, caption) in PLOT_CAPTIONS.items() if key in plots]


def environment_section(env: Any, *, markdown: bool = True) -> Section:
    """The facts of the machine and software a report was made from (folded away in Markdown)."""
    return Section("facts", environment_facts(env), "Environment", folded=True, head=("environment", ""),
                   markdown=markdown)


def trace_sections(trace: Any, plots: Collection[str], kernel: Any = None) -> list[Section]:
    """The report of one run, after its title and verdict: why, where it forks, how to reproduce it, with what."""
    out = []
    crash = crash_warning(trace)
    if crash:
        out.append(Section("warning", crash))
    broken = backend_warning(trace)
    if broken:
        out.append(Section("warning", [broken]))
    explanation = obj(trace.diagnosis).get("explanation")
    if explanation:
        out.append(Section("paragraph", explanation))
    out.append(Section("facts", verdict_facts(trace)))
    task = quality_rows(trace)
    if task:  # the prompt came from a task suite: did the fork change the answer?
        out.append(Section("facts", task, "Task outcome"))
    ctx = fork_context(trace)
    if ctx is not None:
        out.append(Section("fork", ctx, f"The fork, token {ctx['index']}"))
    if kernel is not None:
        out.append(Section("kernel", kernel))
    out += ties_sections(trace)
    out += plot_sections(plots)
    out.append(Section("facts", acceptance_facts(trace), "Acceptance and speed"))
    out.append(Section("commands", commands(trace), "Reproduce with llama.cpp"))
    rerun = rerun_command(trace)  # by the models' names, with the files they were here
    if rerun:
        out.append(Section("rerun", rerun, "Run this again with specview"))
    out.append(Section("prompt", prompt_block(trace), "Prompt"))
    out.append(Section("facts", config_facts(trace), "Settings", folded=True, head=("setting", "value")))
    out.append(Section("models", model_facts(trace), "Models", folded=True))
    out.append(environment_section(obj(trace.environment)))
    out.append(Section("texts", (trace.vanilla, trace.speculative), "Both texts", markdown=False))
    return out


def ties_sections(trace: Any) -> list[Section]:
    """The run's near-tie density by band, and the backend check per verify width where its diagnosis ran one."""
    from ..diagnose.reference import width_table
    from ..diagnose.ties import TABLE_HEADERS, intro, table_rows, tie_density

    t = tie_density(trace)
    out = [Section("table", (TABLE_HEADERS, table_rows(t)), "Near-tie density"), Section("paragraph", intro(t))]
    check = obj(obj(trace.diagnosis).get("reference"))
    if check.get("widths"):
        out.append(Section("table", width_table(check), "Backend check per verify width"))
        out.append(Section("paragraph", f"{check.get('test_label')} against {check.get('reference_label')}: pair "
                           "is the test against the reference at each width; drift is the test at that width "
                           "against its own width-1 rows."))
    return out


def matrix_sections(doc: dict[str, Any], fork_trace: Any = None) -> list[Section]:
    """The report of a matrix, after its title: what it shows, the grid, its forks, rates, and how it was run."""
    from ..matrix import CellParams, describe, grid, rates, summarize

    def cell_name(c: dict[str, Any]) -> str:
        return describe(CellParams.from_json(c["params"]))

    cells = doc.get("cells", [])
    spec = doc.get("spec", {})
    out = [Section("summary", summarize(doc), "What it shows"), Section("grid", grid(doc), "Grid")]
    rerun = preset_command(doc.get("spec") or {})
    if rerun:
        out.append(Section("rerun", rerun, "Run this preset again"))
    forks = [c for c in cells if c.get("status") == "ok" and not c.get("identical")]
    if forks:
        rows = []
        for c in forks:
            f = c.get("fork") or {}
            rows.append((cell_name(c), c.get("first_mismatch"), quoted(f.get("vanilla_piece")),
                         quoted(f.get("speculative_piece")), category(c), fmt(c.get("gap")), c.get("trace") or ""))
        out.append(Section("forks", rows, "Forks"))
    errs = [c for c in cells if c.get("status") == "error"]
    if errs:
        out.append(Section("failed", [(cell_name(c), c.get("error")) for c in errs], "Failed cells", markdown=False))
    out.append(Section("kernel_citation", doc))
    out.append(Section("rates", rates(doc)))
    cell = earliest_fork(doc)
    cmds = commands(fork_trace) if fork_trace is not None and cell is not None else None
    if isinstance(cmds, dict):  # the earliest fork's saved trace, when it reads back as a llama.cpp run
        out.append(Section("repro", (cmds, cell_name(cell), cell), "Reproduce the earliest fork"))
    out.append(Section("facts", spec_rows(spec), "Axes", folded=True, head=("axis", "values")))
    out.append(Section("counters", (doc.get("counters") or {}, doc.get("elapsed_s")), folded=True, markdown=False))
    out.append(environment_section(doc.get("environment") or {}))
    return out


def kernels_sections(kmap: Any) -> list[Section]:
    """The report of a kernel map itself, after its title: the heatmap, then per target its facts and widths."""
    heat = [(t.label, [heat_cell(t.widths.get(w)) for w in kmap.widths]) for t in kmap.targets]
    out = [Section("paragraph", map_intro(kmap)), Section("heatmap", (kmap.widths, heat), "Heatmap"),
           Section("note", LEGEND)]
    for t in kmap.targets:
        out.append(Section("facts", target_facts(t), t.label))
        out.append(Section("table", (WIDTH_HEADERS, width_rows(t))))
    out.append(environment_section(kmap.environment))
    return out


def rate_groups(r: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]],
                                            list[dict[str, Any]]] | None:
    """What the rates section shows of :func:`~specview.core.matrix.rates`: the settings that ran two prompts or
    more, their (setting label, category) pairs, the settings that forked; None where no setting did."""
    settings = [g for g in r["settings"] if g["n"] >= 2]
    if not settings:
        return None
    cats = [(g["label"], c) for g in settings for c in g["categories"]]
    return settings, cats, [g for g in settings if g["forks"]]


def fold_summary(sections: list[Section]) -> str:
    """What a fold holds, from its sections' headings: "Settings, models and environment"."""
    titles = [s.title for s in sections if s.title]
    if len(titles) == 1:
        return titles[0]
    return ", ".join([titles[0], *(t.lower() for t in titles[1:-1])]) + " and " + titles[-1].lower()


__all__ = ["Section", "environment_section", "fold_summary", "kernels_sections", "matrix_sections",
           "plot_sections", "rate_groups", "trace_sections"]
