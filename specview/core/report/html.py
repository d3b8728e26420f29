"""The self-contained HTML report of a trace or a matrix (plots embedded as ``data:`` URIs)."""

from __future__ import annotations

import base64
from typing import Any, Mapping, Sequence

from ... import __version__
from ..matrix.quality import answers_text
from ..matrix.rates import pct, positions_text, rate_text
from ..matrix.summary import cell_text
from ..verdicts import CATEGORIES, COLOURS, WORDS
from .escape import esc, visible
from .facts import cell_colour, cell_detail, headline, obj, trace_title, verdict_of
from .kernels import WIDTH_HEADERS, map_title, matrix_citation, matrix_kernel_rows
from .outline import Section, kernels_sections, matrix_sections, rate_groups, trace_sections

CSS = """
body{font:15px/1.45 -apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:0;color:#1d1d1f;background:#fff}
main{max-width:1080px;margin:0 auto;padding:22px 28px 40px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
.sub{color:#666;font-size:13px;margin-bottom:14px}
.verdict{padding:12px 16px;border-radius:6px;font-size:16px;margin:12px 0 6px;border:1px solid rgba(0,0,0,.12)}
.verdict b{font-size:17px}
table.kv{border-collapse:collapse;font-size:13.5px}table.kv td,table.kv th{padding:3px 12px 3px 0;vertical-align:top;text-align:left}
table.kv td:first-child{color:#555;white-space:nowrap}table.kv td+td{overflow-wrap:anywhere}
table.kv{max-width:100%}
table.kv th{color:#333;border-bottom:1px solid #ddd}
code,pre,.tok{font-family:'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:5px;padding:9px 11px;white-space:pre-wrap;word-break:break-all;margin:6px 0}
table.fork{border-collapse:collapse;margin:6px 0}table.fork td{padding:4px 8px;vertical-align:baseline}
table.fork td.arm{color:#555;font-size:13px;white-space:nowrap}
.tok{white-space:pre-wrap;border-right:1px solid rgba(0,0,0,.13);padding:0 1px}
.shared{color:#444}.at{background:#f3a0a0;font-weight:bold;border-radius:2px}.after{color:#777}
.ell{color:#aaa}
figure{margin:10px 0}figure img{max-width:100%;border:1px solid #e5e5e5}figcaption{color:#666;font-size:12.5px}
table.grid{border-collapse:collapse;font-size:13px}table.grid th,table.grid td{border:1px solid #ccc;padding:4px 7px;text-align:center}
table.grid th{background:#f4f4f4}table.grid td.row{text-align:left;font-weight:600;background:#f8f8f8}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border-radius:3px;font-size:12.5px;border:1px solid rgba(0,0,0,.1)}
ul.summary li{margin:3px 0}
.note{color:#666;font-size:13px}
.contra{padding:10px 14px;border-radius:6px;margin:8px 0;border:2px solid #b00020;background:#f2a7a7}
table.heat{border-collapse:collapse;font-size:12.5px}table.heat th,table.heat td{border:1px solid #ccc;padding:3px 6px;text-align:center}
table.heat th{background:#f4f4f4}table.heat td.row{text-align:left;font-weight:600;background:#f8f8f8;white-space:nowrap}
"""


def _kv_html(rows: Sequence[tuple[str, str]]) -> str:
    return "<table class=kv>" + "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in rows) + "</table>"


def _tok_html(tok: tuple[int, str] | None, cls: str) -> str:
    if tok is None:
        return f"<span class='tok {cls}' title='no token'>(end of output)</span>"
    t, piece = tok
    return f"<span class='tok {cls}' title='token {esc(t)}'>{esc(visible(piece))}</span>"


def _fork_html(ctx: dict[str, Any]) -> str:
    rows = []
    for arm in ("vanilla", "speculative"):
        a = ctx[arm]
        before = "".join(_tok_html(t, "shared") for t in ctx["before"])
        ell = "<span class=ell>…</span>" if ctx["truncated"] else ""
        after = "".join(_tok_html(t, "after") for t in a["after"])
        rows.append(f"<tr><td class=arm>{arm}</td><td>{ell}{before}{_tok_html(a['at'], 'at')}{after}"
                    f"<span class=ell>…</span></td></tr>")
    return ("<table class=fork>" + "".join(rows) + "</table>"
            "<p class=note>Token boundaries are drawn as thin lines; ⏎ is a newline. "
            "The highlighted token is the first one the arms disagree on; the tokens before it are shared.</p>")


def _img_html(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f"<figure><img alt='{esc(alt)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>\n{body}\n</main></body></html>\n")


def _table_html(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table of plain strings, every cell escaped."""
    return ("<table class=kv><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows) + "</table>")


def kernel_section_html(sec: Any) -> str:
    """A trace report's "Kernel map" section: the prediction for this run, the row's per-width table, the meaning."""
    parts = ["<h2>Kernel map</h2>", _kv_html(sec.facts)]
    if sec.contradiction:
        parts.append(f"<div class=contra>{esc(sec.meaning)}</div>")
    else:
        parts.append(f"<p>{esc(sec.meaning)}</p>")
    if sec.table:
        parts.append(f"<p class=note>The map's row {esc(sec.row_label)}, per verify width:</p>")
        parts.append(_table_html(WIDTH_HEADERS, sec.table))
    return "\n".join(parts)


class HtmlWriter:
    """Draws a report's sections (:mod:`.outline`) as HTML, each a list of parts; ``plots`` are the PNG bytes
    of the plot sections, by name."""

    def __init__(self, plots: Mapping[str, bytes] | None = None) -> None:
        self.plots = plots or {}

    def draw(self, sections: Sequence[Section]) -> list[str]:
        return [part for s in sections for part in getattr(self, s.kind)(s)]

    @staticmethod
    def heading(s: Section) -> list[str]:
        return [f"<h2>{esc(s.title)}</h2>"] if s.title else []

    def warning(self, s: Section) -> list[str]:
        first, *rest = s.body
        return [f"<div class=verdict style='background:{COLOURS.get('state', '#fcc')}'><b>⚠ {esc(first)}</b>"
                + "".join(f"<br>{esc(ln.strip())}" for ln in rest) + "</div>"]

    def paragraph(self, s: Section) -> list[str]:
        return [f"<p>{esc(s.body)}</p>"]

    def note(self, s: Section) -> list[str]:
        return [f"<p class=note>{esc(s.body)}</p>"]

    def facts(self, s: Section) -> list[str]:
        return self.heading(s) + [_kv_html(s.body)]

    def table(self, s: Section) -> list[str]:
        return self.heading(s) + [_table_html(*s.body)]

    def code(self, s: Section) -> list[str]:
        return self.heading(s) + [f"<pre>{esc(s.body)}</pre>"]

    def fork(self, s: Section) -> list[str]:
        return self.heading(s) + [_fork_html(s.body)]

    def kernel(self, s: Section) -> list[str]:
        return [kernel_section_html(s.body)]

    def plot(self, s: Section) -> list[str]:
        key, caption = s.body
        return self.heading(s) + [_img_html(self.plots[key], s.title, caption)]

    def commands(self, s: Section) -> list[str]:
        cmds, out = s.body, self.heading(s)
        if isinstance(cmds, str):
            return out + [f"<p class=note>{esc(cmds)}</p>"]
        out.append("<p class=note>Start both servers, send the same prompt token ids to each, compare the "
                   "tokens. The flags are llama.cpp's own (common/arg.cpp).</p>")
        out.append(f"<pre>{esc(cmds['server_vanilla'])}\n\n{esc(cmds['server_speculative'])}</pre>")
        out.append(f"<pre>{esc(cmds['request'])}</pre>")
        if "cli_vanilla" in cmds:
            out.append("<p class=note>Or with the command-line tool (it applies the chat template itself):</p>")
            out.append(f"<pre>{esc(cmds['cli_vanilla'])}\n\n{esc(cmds['cli_speculative'])}</pre>")
        return out

    def prompt(self, s: Section) -> list[str]:
        label, text = s.body
        return self.heading(s) + [f"<p class=note>{esc(label)}</p><pre>{esc(text)}</pre>"]

    def models(self, s: Section) -> list[str]:
        return self.heading(s) + ["<table class=kv><tr><th></th><th>target</th><th>draft</th></tr>" + "".join(
            f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>" for a, b, c in s.body) + "</table>"]

    def texts(self, s: Section) -> list[str]:
        return self.heading(s) + [f"<p class=note>{esc(arm.name)} ({len(arm.tokens)} tokens)</p>"
                                  f"<pre>{esc(arm.text)}</pre>" for arm in s.body]

    def summary(self, s: Section) -> list[str]:
        return [f"<h2>{esc(s.title)}</h2><ul class=summary>" + "".join(f"<li>{esc(x)}</li>" for x in s.body) + "</ul>"]

    def grid(self, s: Section) -> list[str]:
        g = s.body
        legend = "<div class=legend>" + "".join(
            f"<span style='background:{COLOURS[k]}'>{esc(WORDS[k] if k == 'diverged' else k)}</span>"
            for k in CATEGORIES) + "</div>"
        head = "<tr><th>" + esc(" · ".join(g.row_axes)) + "</th>" + "".join(
            f"<th>{esc(g.col_label(c))}</th>" for c in g.cols) + "</tr>"
        body = []
        for r in g.rows:
            tds = []
            for c in g.cols:
                cell = g.at.get((r, c))
                detail = cell_detail(cell) if cell and cell.get("status") == "ok" else (
                    cell.get("error", "") if cell else "")
                tds.append(f"<td style='background:{cell_colour(cell)}' title='{esc(detail)}'>{esc(cell_text(cell))}"
                           + (f"<br><small>{esc(detail)}</small>" if detail and cell and cell.get('status') == 'ok'
                              else "") + "</td>")
            body.append(f"<tr><td class=row>{esc(g.row_label(r))}</td>{''.join(tds)}</tr>")
        return self.heading(s) + [legend, f"<table class=grid>{head}{''.join(body)}</table>"]

    def rerun(self, s: Section) -> list[str]:
        return [f"<h2>{esc(s.title)}</h2><pre>{esc(s.body)}</pre>"]

    def forks(self, s: Section) -> list[str]:
        return ([f"<h2>{esc(s.title)}</h2><table class=kv><tr><th>cell</th><th>token</th><th>vanilla</th>"
                 "<th>speculative</th><th>verdict</th><th>gap</th><th>trace</th></tr>"]
                + [f"<tr><td>{esc(name)}</td><td>{esc(token)}</td><td><code>{esc(vp)}</code></td>"
                   f"<td><code>{esc(sp)}</code></td><td>{esc(verdict)}</td><td>{esc(gap)}</td>"
                   f"<td>{esc(trace)}</td></tr>"
                   for name, token, vp, sp, verdict, gap, trace in s.body]
                + ["</table>"])

    def failed(self, s: Section) -> list[str]:
        return [f"<h2>{esc(s.title)}</h2><ul>" + "".join(f"<li>{esc(name)}: {esc(err)}</li>" for name, err in s.body)
                + "</ul>"]

    def kernel_citation(self, s: Section) -> list[str]:
        return [matrix_kernel_html(s.body)]

    def rates(self, s: Section) -> list[str]:
        return [rates_html(s.body)]

    def repro(self, s: Section) -> list[str]:
        cmds, name, cell = s.body
        return [f"<h2>{esc(s.title)}</h2><p class=note>{esc(name)}: token {esc(cell['first_mismatch'])}, from its "
                f"saved trace {esc(cell.get('trace'))} (<code>specview report</code> on that file gives its full "
                "report).</p>"
                f"<pre>{esc(cmds['server_vanilla'])}\n\n{esc(cmds['server_speculative'])}</pre>"
                f"<pre>{esc(cmds['request'])}</pre>"]

    def counters(self, s: Section) -> list[str]:
        ctr, elapsed = s.body
        return [f"<p class=note>{esc(ctr.get('loads'))} model loads, {esc(ctr.get('vanilla_runs'))} vanilla runs, "
                f"{esc(ctr.get('speculative_runs'))} speculative runs, {esc(elapsed)} s.</p>"]

    def heatmap(self, s: Section) -> list[str]:
        widths, rows = s.body
        head = "<tr><th>target</th>" + "".join(f"<th>{esc(w)}</th>" for w in widths) + "</tr>"
        body = [f"<tr><td class=row>{esc(label)}</td>" + "".join(
            f"<td style='background:{colour}' title='{esc(tip)}'>{esc(sym)}</td>" for sym, colour, tip in cells)
            + "</tr>" for label, cells in rows]
        return self.heading(s) + [f"<table class=heat>{head}{''.join(body)}</table>"]


def trace_html(trace: Any, plots: Mapping[str, bytes], kernel: Any = None) -> str:
    """The report of one run; ``kernel`` (:func:`~specview.core.report.kernels.trace_kernel_section`) adds the
    kernel map's prediction for it."""
    v = verdict_of(trace)
    env = obj(trace.environment)
    parts = [f"<h1>specview report: {esc(trace_title(trace))}</h1>",
             f"<div class=sub>specview {esc(env.get('specview', __version__))} · "
             f"{esc(env.get('created', ''))} · greedy speculative decoding against plain greedy</div>",
             f"<div class=verdict style='background:{COLOURS.get(v, '#fff')}'><b>{esc(v.upper())}</b> — "
             f"{esc(headline(trace))}</div>"]
    parts += HtmlWriter(plots).draw(trace_sections(trace, plots, kernel))
    return _page(f"specview: {v}", "\n".join(parts))


def matrix_html(doc: dict[str, Any], fork_trace: Any = None) -> str:
    cells = doc.get("cells", [])
    spec = doc.get("spec", {})
    parts = [f"<h1>specview matrix: {len(cells)} cells</h1>",
             f"<div class=sub>specview {esc(doc.get('specview', ''))} · {esc(doc.get('created', ''))} · "
             f"status {esc(doc.get('status'))} · {esc(spec.get('max_tokens'))} tokens per arm</div>"]
    parts += HtmlWriter().draw(matrix_sections(doc, fork_trace))
    return _page("specview matrix", "\n".join(parts))


def matrix_kernel_html(doc: dict[str, Any]) -> str:
    """The cited kernel map: its citation, the contradictions, and each cell's prediction against its outcome."""
    from ..matrix.evidence import contradiction_lines

    cite = matrix_citation(doc)
    rows = matrix_kernel_rows(doc)
    if cite is None and not rows:
        return ""
    parts = ["<h2>Kernel map</h2>"]
    if cite is not None:
        parts.append(f"<p class=note>{esc(cite)}</p>")
    parts += [f"<div class=contra>{esc(line)}</div>" for line in contradiction_lines(doc)]
    if rows:
        parts.append(_table_html(("cell", "prediction", "detail", "outcome", ""), rows))
    return "\n".join(parts)


def kernels_html(kmap: Any, file: str | None = None) -> str:
    """The report of a kernel map itself: the heatmap, then per target its facts and per-width table."""
    parts = [f"<h1>specview kernel map: {esc(map_title(kmap, file))}</h1>",
             f"<div class=sub>specview {esc(kmap.environment.get('specview', __version__))} · "
             f"{esc(kmap.environment.get('created', ''))} · engine {esc(kmap.backend)}</div>"]
    parts += HtmlWriter().draw(kernels_sections(kmap))
    return _page("specview kernel map", "\n".join(parts))


# -- rates -------------------------------------------------------------------------------
SEVERITY_COLOURS = {"near-tie": COLOURS["near-tie"], "material": COLOURS["state"], "undiagnosed": COLOURS["diverged"]}


def _bar(count: int, most: int, colour: str, width: int = 160) -> str:
    if count <= 0 or most <= 0:
        return ""
    return (f"<span style='display:inline-block;height:11px;width:{max(2, round(width * count / most))}px;"
            f"background:{colour};border:1px solid rgba(0,0,0,.25);vertical-align:middle'></span>")


def _interval(g: dict[str, Any], width: int = 160) -> str:
    """The rate as a dot on a [0, 1] line, its 95% interval as a band."""
    if not g["n"]:
        return ""
    lo, hi, r = g["low"], g["high"], g["rate"]
    return (f"<span style='display:inline-block;position:relative;width:{width}px;height:11px;"
            f"background:#f1f1f1;border:1px solid #ccc;vertical-align:middle'>"
            f"<span style='position:absolute;left:{lo * width:.1f}px;width:{max(1.0, (hi - lo) * width):.1f}px;"
            f"top:0;bottom:0;background:{COLOURS['diverged']}'></span>"
            f"<span style='position:absolute;left:{max(0.0, r * width - 1):.1f}px;width:2px;top:0;bottom:0;"
            f"background:#333'></span></span>")


def _answers_td(g: dict[str, Any]) -> str:
    """A task suite's answers beside the forks, tinted where some changed."""
    a = g.get("answers")
    tint = f" style='background:{COLOURS['state' if a['changed_state'] else 'diverged']}'" if a and a["changed"] else ""
    return f"<td{tint}>{esc(answers_text(a).removeprefix('answers: '))}</td>"


def _rate_row(label: str, g: dict[str, Any], scored: bool = False) -> str:
    sev = g["severity"]
    return (f"<tr><td>{esc(label)}</td><td>{g['n']}</td><td>{g['forks']}</td>{_answers_td(g) if scored else ''}"
            f"<td>{esc(pct(g['rate']))}</td>"
            f"<td>{esc(pct(g['low']))} – {esc(pct(g['high']))}</td><td>{_interval(g)}</td>"
            f"<td>{esc(positions_text(g))}</td><td>{sev['near-tie']} / {sev['material']} / {sev['undiagnosed']}</td>"
            "</tr>")


def rates_html(r: dict[str, Any]) -> str:
    """Per setting and category: the divergence rate with its interval; fork positions; the gap histogram."""
    groups = rate_groups(r)
    if groups is None:
        return ""
    settings, cats, forked = groups
    scored = any(g.get("answers") for g in settings)  # a task suite: an answers column beside the forks
    head = ("<tr><th>setting</th><th>prompts</th><th>forks</th>" + ("<th>answers (McNemar p)</th>" if scored else "")
            + "<th>rate</th><th>95% interval</th><th></th><th>fork positions</th>"
            "<th>near-tie / material / undiagnosed</th></tr>")
    parts = ["<h2>Divergence rates</h2>",
             "<p class=note>Per setting, over the prompts it ran: the share of prompts whose arms fork, with a 95% "
             "Wilson interval (the band; the dark line is the rate). A fork is a near-tie when its teacher-forced "
             "gap is within what batched-versus-single numerics can flip (its diagnosis' far threshold: four "
             "times the largest shift before the fork, at least 2 logits), material when it is above.</p>",
             "<table class=kv>" + head + "".join(_rate_row(g["label"], g, scored) for g in settings) + "</table>"]
    parts += ties_rates_html(settings)
    if scored:
        parts.append("<p class=note>Answers: over a task suite, each item's two answers scored; <i>same</i> where "
                     "both arms pass or both fail, <i>changed</i> where one passes and the other fails, with "
                     "McNemar's exact p on the changed ones (a small p: speculation changes answers).</p>")
    if cats:
        parts.append("<h2>Rates by prompt category</h2><table class=kv>" + head.replace("setting", "setting · category")
                     + "".join(_rate_row(f"{label} · {c['category']}", c, scored) for label, c in cats) + "</table>")
    if forked:
        parts.append("<h2>Where the forks fall, and how large the gaps are</h2>")
        for g in forked:
            pos = g["positions"]
            most = max(pos["histogram"])
            rows = "".join(
                f"<tr><td>tokens {i * pos['bin_width']}–{(i + 1) * pos['bin_width'] - 1}</td><td>{n}</td>"
                f"<td>{_bar(n, most, COLOURS['diverged'])}</td></tr>" for i, n in enumerate(pos["histogram"]))
            gmost = max((sum(b.values()) for b in g["gaps"]), default=0)
            grows = "".join(
                f"<tr><td>{esc(lab)} logits</td><td>{b['near-tie']} / {b['material']}</td>"
                f"<td>{_bar(b['near-tie'], gmost, SEVERITY_COLOURS['near-tie'])}"
                f"{_bar(b['material'], gmost, SEVERITY_COLOURS['material'])}</td></tr>"
                for lab, b in zip(r["gap_bins"], g["gaps"]))
            parts.append(f"<p class=note>{esc(g['label'])}: {esc(rate_text(g))}</p>"
                         "<table class=kv><tr><th>fork position</th><th>forks</th><th></th></tr>" + rows + "</table>"
                         "<table class=kv><tr><th>gap at the fork</th><th>near-tie / material</th><th></th></tr>"
                         + grows + "</table>"
                         + (f"<p class=note>{g['severity']['undiagnosed']} fork(s) not diagnosed: no gap.</p>"
                            if g["severity"]["undiagnosed"] else ""))
    return "\n".join(parts)


def ties_table_html(t: dict[str, Any]) -> str:
    """A near-tie density (one run's, or summed over runs) as a table, a row per band."""
    from ..diagnose.ties import TABLE_HEADERS, table_rows

    return _table_html(TABLE_HEADERS, table_rows(t))


def ties_rates_html(settings: Sequence[dict[str, Any]]) -> list[str]:
    """Per setting: how many compared positions lay in each tie band, and how many of them flipped."""
    have = [g for g in settings if g.get("ties")]
    if not have:
        return []
    parts = ["<h2>Near-tie density</h2>",
             "<p class=note>Per setting, over its prompts' positions where both arms saw the same context (the "
             "shared prefix and the fork): those whose vanilla top-1/top-2 margin lies in each tie band, how many "
             "flipped, the rate with a 95% Wilson interval, and the flips outside the band (what that band would "
             "call a bug). The calibrated band is twice each run's measured envelope; 0.125 and 0.5 nats and the "
             "2.0-logit gap are the fixed bands used upstream (nats and logits are the same number for a top-2 "
             "margin).</p>"]
    for g in have:
        t = g["ties"]
        parts.append(f"<p class=note>{esc(g['label'])}: {t['positions']} positions over {t['runs']} run(s), "
                     f"{t['flips']} flip(s)</p>" + ties_table_html(t))
    return parts
