"""The GitHub-ready Markdown report of a trace or a matrix (PNG plots beside it)."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby
from typing import Any, Mapping, Sequence

from ... import __version__
from ..matrix.quality import answers_text, cell_mark
from ..matrix.rates import bar, pct, positions_text, rate_text, ties_block
from ..matrix.summary import cell_text
from .escape import md_code, md_fence, md_text, text, visible
from .facts import headline, obj, trace_title, verdict_of
from .kernels import WIDTH_HEADERS, map_title, matrix_citation, matrix_kernel_rows
from .outline import Section, fold_summary, kernels_sections, matrix_sections, rate_groups, trace_sections


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


class MarkdownWriter:
    """Draws a report's sections (:mod:`.outline`) as Markdown, each a list of parts; ``plot_files`` are the
    files of the plot sections, by name, relative to the report.  The folded sections go in one collapsed
    ``<details>`` block; a section that is not for Markdown is left out."""

    def __init__(self, plot_files: Mapping[str, str] | None = None) -> None:
        self.plot_files = plot_files or {}

    def draw(self, sections: Sequence[Section]) -> list[str]:
        out: list[str] = []
        for folded, run in groupby([s for s in sections if s.markdown], key=lambda s: s.folded):
            group = list(run)
            if not folded:
                out += [part for s in group for part in getattr(self, s.kind)(s)]
                continue
            out.append(f"<details><summary>{fold_summary(group)}</summary>\n")
            out += [part for s in group for part in getattr(self, s.kind)(replace(s, title=""))]
            out.append("</details>\n")
        return out

    @staticmethod
    def heading(s: Section) -> list[str]:
        return [f"### {md_text(s.title)}\n"] if s.title else []

    def warning(self, s: Section) -> list[str]:
        first, *rest = s.body
        return ["> **⚠ " + md_text(first) + "**\n" + "".join(f">\n> {md_text(ln.strip())}\n" for ln in rest)]

    def paragraph(self, s: Section) -> list[str]:
        return [md_text(s.body) + "\n"]

    note = paragraph

    def facts(self, s: Section) -> list[str]:
        return self.heading(s) + [_kv_md(s.body, s.head)]

    def table(self, s: Section) -> list[str]:
        return self.heading(s) + [_table_md(*s.body)]

    def code(self, s: Section) -> list[str]:
        return self.heading(s) + [md_fence(s.body) + "\n"]

    def fork(self, s: Section) -> list[str]:
        return self.heading(s) + [_fork_md(s.body)]

    def kernel(self, s: Section) -> list[str]:
        return [kernel_section_md(s.body)]

    def plot(self, s: Section) -> list[str]:
        key, caption = s.body
        return self.heading(s) + [f"![{s.title}]({self.plot_files[key]})\n\n{md_text(caption)}\n"]

    def commands(self, s: Section) -> list[str]:
        cmds, out = s.body, self.heading(s)
        if isinstance(cmds, str):
            return out + [md_text(cmds) + "\n"]
        out.append("Start both servers, send the same prompt token ids to each, compare the tokens:\n")
        out.append(md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh"))
        out.append(md_fence(cmds["request"], "sh"))
        if "cli_vanilla" in cmds:
            out.append("Or with the command-line tool (it applies the chat template itself):\n")
            out.append(md_fence(cmds["cli_vanilla"] + "\n\n" + cmds["cli_speculative"], "sh"))
        return out

    def prompt(self, s: Section) -> list[str]:
        label, prompt = s.body
        return self.heading(s) + [md_text(label) + "\n", md_fence(prompt, "text")]

    def models(self, s: Section) -> list[str]:
        return self.heading(s) + ["| | target | draft |\n|---|---|---|\n" + "".join(
            f"| {md_text(a)} | {md_code(b, table=True)} | {md_code(c, table=True)} |\n" for a, b, c in s.body)]

    def summary(self, s: Section) -> list[str]:
        return ["\n".join(f"- {md_text(x)}" for x in s.body) + "\n"]

    def grid(self, s: Section) -> list[str]:
        g = s.body
        head = ("| " + md_text(" · ".join(g.row_axes)) + " | " + " | ".join(md_text(g.col_label(c)) for c in g.cols)
                + " |")
        sep = "|" + "---|" * (len(g.cols) + 1)
        rows = []
        for r in g.rows:
            vals = []
            for c in g.cols:
                cell = g.at.get((r, c))
                mark = cell_mark(cell) if cell else ""  # over a task suite: whether the answer changed
                txt = md_text(cell_text(cell) + (f" · {mark}" if mark else ""))
                vals.append(f"**{txt}**" if cell and cell.get("status") == "ok" and not cell.get("identical") else txt)
            rows.append(f"| {md_text(g.row_label(r))} | " + " | ".join(vals) + " |")
        return ["\n".join([head, sep, *rows]) + "\n"]

    def rerun(self, s: Section) -> list[str]:
        return self.heading(s) + [md_fence(s.body, "sh")]  # a model name holding ``` cannot close it

    def forks(self, s: Section) -> list[str]:
        return (self.heading(s)
                + ["| cell | token | vanilla | speculative | verdict | gap |\n|---|---|---|---|---|---|"]
                + [f"| {md_text(name)} | {token} | {md_code(vp, table=True)} | {md_code(sp, table=True)} | "
                   f"{md_text(verdict)} | {md_text(gap)} |" for name, token, vp, sp, verdict, gap, _ in s.body]
                + [""])

    def kernel_citation(self, s: Section) -> list[str]:
        return [matrix_kernel_md(s.body)]

    def rates(self, s: Section) -> list[str]:
        return [rates_md(s.body)]

    def repro(self, s: Section) -> list[str]:
        cmds, name, cell = s.body
        return [f"### {md_text(s.title)}\n\n"
                f"{md_text(name)}: token {cell['first_mismatch']}, from its saved trace {md_code(cell.get('trace'))} "
                "(`specview report` on that file gives its full report).\n\n"
                + md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh") + "\n"
                + md_fence(cmds["request"], "sh")]

    def heatmap(self, s: Section) -> list[str]:
        widths, rows = s.body
        return self.heading(s) + [_table_md(["target", *(str(w) for w in widths)],
                                            [[label] + [cell[0] for cell in cells] for label, cells in rows])]


def made_with(version: Any) -> str:
    """The line a Markdown report ends with."""
    return f"<sub>Made with specview {md_text(version)}.</sub>\n"


def trace_markdown(trace: Any, plot_files: Mapping[str, str], card: str | None = None, kernel: Any = None) -> str:
    """The report; ``card`` is the fork card's file, relative to the report, shown first; ``kernel`` adds the
    kernel map's prediction for the run."""
    v = verdict_of(trace)
    out = [f"## specview: {md_text(v)} — {md_text(trace_title(trace))}\n"]
    if card:
        out.append(f"![fork card]({card.replace(' ', '%20').replace(')', '%29').replace('(', '%28')})\n")
    out.append(f"**{md_text(headline(trace))}**\n")
    env = obj(trace.environment)
    out += MarkdownWriter(plot_files).draw(trace_sections(trace, plot_files, kernel))
    out.append(made_with(env.get("specview", __version__)))
    return "\n".join(out)


def matrix_markdown(doc: dict[str, Any], fork_trace: Any = None) -> str:
    out = [f"## specview matrix: {len(doc.get('cells', []))} cells ({md_text(doc.get('status'))})\n"]
    out += MarkdownWriter().draw(matrix_sections(doc, fork_trace))
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
    out = [f"## specview kernel map: {md_text(map_title(kmap, file))}\n"]
    out += MarkdownWriter().draw(kernels_sections(kmap))
    out.append(made_with(kmap.environment.get("specview", __version__)))
    return "\n".join(out)


def _rate_row(label: str, g: dict[str, Any], scored: bool = False) -> str:
    sev = g["severity"]
    a = f" {md_text(answers_text(g.get('answers')).removeprefix('answers: '))} |" if scored else ""
    return (f"| {md_text(label)} | {g['n']} | {g['forks']} |{a} {md_text(pct(g['rate']))} | "
            f"{md_text(pct(g['low']))} – {md_text(pct(g['high']))} | {md_text(positions_text(g))} | "
            f"{sev['near-tie']} / {sev['material']} / {sev['undiagnosed']} |")


def rates_md(r: dict[str, Any]) -> str:
    """Per setting and category: the divergence rate with its interval; fork positions; the gap histogram."""
    groups = rate_groups(r)
    if groups is None:
        return ""
    settings, cats, forked = groups
    scored = any(g.get("answers") for g in settings)  # a task suite: an answers column beside the forks
    head = ("| {} | prompts | forks |" + (" answers (McNemar p) |" if scored else "") + " rate | 95% interval | "
            "fork positions | near-tie / material / undiagnosed |\n" + "|---" * (8 if scored else 7) + "|")
    out = ["### Divergence rates\n",
           "Per setting, over the prompts it ran: the share of prompts whose arms fork, with a 95% Wilson interval. "
           "A fork is a near-tie when its teacher-forced gap is within what batched-versus-single numerics can flip "
           "(its diagnosis' far threshold: four times the largest shift before the fork, at least 2 logits), "
           "material when it is above.\n",
           "\n".join([head.format("setting"), *(_rate_row(g["label"], g, scored) for g in settings)]) + "\n"]
    if scored:
        out.append("Answers: over a task suite, each item's two answers scored; *same* where both arms pass or both "
                   "fail, *changed* where one passes and the other fails, with McNemar's exact p on the changed ones "
                   "(a small p: speculation changes answers).\n")
    if cats:
        out.append("#### By prompt category\n")
        out.append("\n".join([head.format("setting · category"),
                              *(_rate_row(f"{label} · {c['category']}", c, scored) for label, c in cats)]) + "\n")
    if ties_block(settings):  # positions in each tie band and the flips among them, per setting
        out += ["#### Near-tie density\n", md_fence(ties_block(settings), "text")]
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
