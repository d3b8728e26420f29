"""The GitHub-ready Markdown report of a trace or a matrix (PNG plots beside it)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ... import __version__
from ..matrix.rates import bar, pct, positions_text, rate_text
from ..verdicts import category, cell_text
from .escape import md_code, md_fence, md_text, text, visible
from .kernels import (LEGEND, WIDTH_HEADERS, heat_cell, map_intro, map_title, matrix_citation, matrix_kernel_rows,
                      target_facts, width_rows)
from .facts import (PLOT_CAPTIONS, commands, obj, acceptance_facts, backend_warning, config_facts, crash_warning, earliest_fork,
                    environment_facts, fmt, fork_context, headline, model_facts, preset_command, prompt_block, quoted,
                    spec_rows, trace_title, verdict_facts, verdict_of)


def _kv_md(rows: Sequence[tuple[str, str]], head: tuple[str, str] = ("", "")) -> str:
    out = [f"| {md_text(head[0]) or ' '} | {md_text(head[1]) or ' '} |", "|---|---|"]
    out += [f"| {md_text(a)} | {md_code(b, table=True)} |" for a, b in rows]
    return "\n".join(out) + "\n"


def _fork_md(ctx: dict[str, Any]) -> str:
    def seq(toks: Sequence[tuple[int, str]]) -> str:
        return "".join(visible(p) for _, p in toks)

    lines = []
    for arm in ("vanilla", "speculative"):
        a = ctx[arm]
        at = visible(a["at"][1]) if a["at"] else "(end of output)"
        lines.append(f"{arm:<12} {'…' if ctx['truncated'] else ''}{seq(ctx['before'])}⟦{at}⟧{seq(a['after'])}…")
    ids = [f"{arm}: token {text(ctx[arm]['at'][0])}" if ctx[arm]["at"] else f"{arm}: none" for arm in ("vanilla", "speculative")]
    return (md_fence("\n".join(lines)) + "\n⟦ ⟧ marks the first token the arms disagree on "
            f"({md_text('; '.join(ids))}); ⏎ is a newline.\n")


def _table_md(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table of plain strings, every cell escaped (an empty header cell stays a cell)."""
    out = ["| " + " | ".join(md_text(h) or " " for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(md_text(v) or " " for v in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def kernel_section_md(sec: Any) -> str:
    """A trace report's "Kernel map" section (see :func:`~specview.core.report.kernels.trace_kernel_section`)."""
    out = ["### Kernel map\n", _kv_md(sec.facts)]
    out.append(("⚠ " if sec.contradiction else "") + md_text(sec.meaning) + "\n")
    if sec.table:
        out.append(f"The map's row {md_code(sec.row_label)}, per verify width:\n")
        out.append(_table_md(WIDTH_HEADERS, sec.table))
    return "\n".join(out)


def trace_markdown(trace: Any, plot_files: Mapping[str, str], card: str | None = None, kernel: Any = None) -> str:
    """The report; ``card`` is the fork card's file, relative to the report, shown first; ``kernel`` adds the
    kernel map's prediction for the run."""
    v = verdict_of(trace)
    out = [f"## specview: {md_text(v)} — {md_text(trace_title(trace))}\n"]
    if card:
        out.append(f"![fork card]({card.replace(' ', '%20').replace(')', '%29').replace('(', '%28')})\n")
    out.append(f"**{md_text(headline(trace))}**\n")
    d = obj(trace.diagnosis)
    env = obj(trace.environment)
    crash = crash_warning(trace)
    if crash:
        out.append("> **⚠ " + md_text(crash[0]) + "**\n" + "".join(f">\n> {md_text(ln.strip())}\n" for ln in crash[1:]))
    broken = backend_warning(trace)
    if broken:
        out.append(f"> **⚠ {md_text(broken)}**\n")
    if d.get("explanation"):
        out.append(md_text(d["explanation"]) + "\n")
    out.append(_kv_md(verdict_facts(trace)))
    ctx = fork_context(trace)
    if ctx is not None:
        out.append(f"### The fork, token {ctx['index']}\n")
        out.append(_fork_md(ctx))
    if kernel is not None:
        out.append(kernel_section_md(kernel))
    for key in PLOT_CAPTIONS:
        if key in plot_files:
            title, cap = PLOT_CAPTIONS[key]
            out.append(f"### {title}\n")
            out.append(f"![{title}]({plot_files[key]})\n\n{md_text(cap)}\n")
    out.append("### Acceptance and speed\n")
    out.append(_kv_md(acceptance_facts(trace)))
    cmds = commands(trace)
    out.append("### Reproduce with llama.cpp\n")
    if isinstance(cmds, str):
        out.append(md_text(cmds) + "\n")
    else:
        out.append("Start both servers, send the same prompt token ids to each, compare the tokens:\n")
        out.append(md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh"))
        out.append(md_fence(cmds["request"], "sh"))
        if "cli_vanilla" in cmds:
            out.append("Or with the command-line tool (it applies the chat template itself):\n")
            out.append(md_fence(cmds["cli_vanilla"] + "\n\n" + cmds["cli_speculative"], "sh"))
    label, prompt = prompt_block(trace)
    out.append("### Prompt\n")
    out.append(md_text(label) + "\n")
    out.append(md_fence(prompt, "text"))
    out.append("<details><summary>Settings, models and environment</summary>\n")
    out.append(_kv_md(config_facts(trace), ("setting", "value")))
    mrows = model_facts(trace)
    out.append("| | target | draft |\n|---|---|---|\n" + "".join(
        f"| {md_text(a)} | {md_code(b, table=True)} | {md_code(c, table=True)} |\n" for a, b, c in mrows))
    out.append(_kv_md(environment_facts(env), ("environment", "")))
    out.append("</details>\n")
    out.append(f"<sub>Made with specview {md_text(env.get('specview', __version__))}.</sub>\n")
    return "\n".join(out)


def _repro_md(trace: Any, cell: dict[str, Any]) -> str:
    from ..matrix import CellParams, describe

    cmds = commands(trace)
    if isinstance(cmds, str):
        return ""
    return ("### Reproduce the earliest fork\n\n"
            f"{md_text(describe(CellParams.from_json(cell['params'])))}: token {cell['first_mismatch']}, from its saved "
            f"trace {md_code(cell.get('trace'))} (`specview report` on that file gives its full report).\n\n"
            + md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh") + "\n"
            + md_fence(cmds["request"], "sh"))


def matrix_markdown(doc: dict[str, Any], fork_trace: Any = None) -> str:
    from ..matrix import CellParams, describe, grid, rates, summarize

    g = grid(doc)
    cells = doc.get("cells", [])
    out = [f"## specview matrix: {len(cells)} cells ({md_text(doc.get('status'))})\n"]
    out.append("\n".join(f"- {md_text(s)}" for s in summarize(doc)) + "\n")
    head = "| " + md_text(" · ".join(g.row_axes)) + " | " + " | ".join(md_text(g.col_label(c)) for c in g.cols) + " |"
    sep = "|" + "---|" * (len(g.cols) + 1)
    rows = []
    for r in g.rows:
        vals = []
        for c in g.cols:
            cell = g.at.get((r, c))
            txt = md_text(cell_text(cell))
            vals.append(f"**{txt}**" if cell and cell.get("status") == "ok" and not cell.get("identical") else txt)
        rows.append(f"| {md_text(g.row_label(r))} | " + " | ".join(vals) + " |")
    out.append("\n".join([head, sep, *rows]) + "\n")
    rerun = preset_command(doc.get("spec") or {})
    if rerun:
        out.append("### Run this preset again\n")
        out.append("```sh\n" + rerun + "\n```\n")
    forks = [c for c in cells if c.get("status") == "ok" and not c.get("identical")]
    if forks:
        out.append("### Forks\n")
        out.append("| cell | token | vanilla | speculative | verdict | gap |\n|---|---|---|---|---|---|")
        for c in forks:
            f = c.get("fork") or {}
            out.append(f"| {md_text(describe(CellParams.from_json(c['params'])))} | {c.get('first_mismatch')} | "
                       f"{md_code(quoted(f.get('vanilla_piece')), table=True)} | "
                       f"{md_code(quoted(f.get('speculative_piece')), table=True)} | "
                       f"{md_text(category(c))} | {md_text(fmt(c.get('gap')))} |")
        out.append("")
    out.append(matrix_kernel_md(doc))
    out.append(rates_md(rates(doc)))
    cell = earliest_fork(doc)
    if fork_trace is not None and cell is not None:
        out.append(_repro_md(fork_trace, cell))
    out.append("<details><summary>Axes and environment</summary>\n")
    out.append(_kv_md(spec_rows(doc.get("spec", {})), ("axis", "values")))
    out.append(_kv_md(environment_facts(doc.get("environment") or {}), ("environment", "")))
    out.append("</details>\n")
    return "\n".join(out)


def matrix_kernel_md(doc: dict[str, Any]) -> str:
    """The cited kernel map: its citation, the contradictions, and each cell's prediction against its outcome."""
    from ..matrix.evidence import contradiction_lines

    cite = matrix_citation(doc)
    rows = matrix_kernel_rows(doc)
    if cite is None and not rows:
        return ""
    out = ["### Kernel map\n"]
    if cite is not None:
        out.append(md_text(cite) + "\n")
    out += ["⚠ " + md_text(line) + "\n" for line in contradiction_lines(doc)]
    if rows:
        out.append(_table_md(("cell", "prediction", "detail", "outcome", " "), rows))
    return "\n".join(out)


def kernels_markdown(kmap: Any, file: str | None = None) -> str:
    """The report of a kernel map itself: the heatmap, then per target its facts and per-width table."""
    out = [f"## specview kernel map: {md_text(map_title(kmap, file))}\n", md_text(map_intro(kmap)) + "\n",
           "### Heatmap\n"]
    heat = [[t.label] + [heat_cell(t.widths.get(w))[0] for w in kmap.widths] for t in kmap.targets]
    out.append(_table_md(["target", *(str(w) for w in kmap.widths)], heat))
    out.append(md_text(LEGEND) + "\n")
    for t in kmap.targets:
        out.append(f"### {md_text(t.label)}\n")
        out.append(_kv_md(target_facts(t)))
        out.append(_table_md(WIDTH_HEADERS, width_rows(t)))
    out.append("<details><summary>Environment</summary>\n")
    out.append(_kv_md(environment_facts(kmap.environment), ("environment", "")))
    out.append("</details>\n")
    out.append(f"<sub>Made with specview {md_text(kmap.environment.get('specview', __version__))}.</sub>\n")
    return "\n".join(out)


def _rate_row(label: str, g: dict[str, Any]) -> str:
    sev = g["severity"]
    return (f"| {md_text(label)} | {g['n']} | {g['forks']} | {md_text(pct(g['rate']))} | "
            f"{md_text(pct(g['low']))} – {md_text(pct(g['high']))} | {md_text(positions_text(g))} | "
            f"{sev['near-tie']} / {sev['material']} / {sev['undiagnosed']} |")


def rates_md(r: dict[str, Any]) -> str:
    """Per setting and category: the divergence rate with its interval; fork positions; the gap histogram."""
    settings = [g for g in r["settings"] if g["n"] >= 2]
    if not settings:
        return ""
    head = ("| {} | prompts | forks | rate | 95% interval | fork positions | near-tie / material / undiagnosed |\n"
            "|---|---|---|---|---|---|---|")
    out = ["### Divergence rates\n",
           "Per setting, over the prompts it ran: the share of prompts whose arms fork, with a 95% Wilson interval. "
           "A fork is a near-tie when its teacher-forced gap is within what batched-versus-single numerics can flip "
           "(its diagnosis' far threshold: four times the largest shift before the fork, at least 2 logits), "
           "material when it is above.\n",
           "\n".join([head.format("setting"), *(_rate_row(g["label"], g) for g in settings)]) + "\n"]
    cats = [(g["label"], c) for g in settings for c in g["categories"]]
    if cats:
        out.append("#### By prompt category\n")
        out.append("\n".join([head.format("setting · category"),
                              *(_rate_row(f"{label} · {c['category']}", c) for label, c in cats)]) + "\n")
    forked = [g for g in settings if g["forks"]]
    if forked:
        out.append("#### Where the forks fall, and how large the gaps are\n")
        lines: list[str] = []
        for g in forked:
            pos = g["positions"]
            lines.append(f"{visible(g['label'])}: {rate_text(g)}")
            most = max(pos["histogram"])
            for i, n in enumerate(pos["histogram"]):
                lo = i * pos["bin_width"]
                lines.append(f"  tokens {lo:>4}–{lo + pos['bin_width'] - 1:<4} {n:>3} {bar(n, most)}")
            gmost = max((sum(b.values()) for b in g["gaps"]), default=0)
            for lab, b in zip(r["gap_bins"], g["gaps"]):
                lines.append(f"  gap {lab:>9} {b['near-tie']:>3} near-tie {b['material']:>3} material "
                             f"{bar(b['near-tie'], gmost)}{bar(b['material'], gmost).replace('█', '▓')}")
            if g["severity"]["undiagnosed"]:
                lines.append(f"  {g['severity']['undiagnosed']} fork(s) not diagnosed: no gap")
            lines.append("")
        out.append(md_fence("\n".join(lines), "text"))
        out.append("█ near-tie, ▓ material.\n")
    return "\n".join(out)
