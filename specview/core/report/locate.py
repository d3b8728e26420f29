"""The report of a locate (``specview.locate/1``): where the batched pass first departs, the plot, the growth.

Qt-free: the |Δ|-along-the-graph plot arrives as PNG bytes from the renderer
the writer was given (the app's own plot widget, :mod:`specview.gui.locate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ... import __version__
from ..kernels.text import settings_label
from ..locate.text import describe
from .escape import esc, md_fence, md_text, text
from .facts import PLOT_CAPTIONS, environment_facts
from .html import _img_html, _kv_html, _page, _table_html
from .markdown import _kv_md, _table_md

PLOT = "locate"
GROWTH_HEADERS = ("part", "|Δ| of its output", "largest |Δ| in it", "differing / compared", "first differing node")


def _g(x: Any) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "n/a"
    return "inf" if x == float("inf") else ("0" if x == 0 else f"{x:.3g}")


def locate_title(loc: Any, file: str | None) -> str:
    name = Path(file).name if file else "locate"
    return f"{name}: {loc.target}, token {loc.position}, row {loc.row} of a width-{loc.width} pass"


def locate_facts(loc: Any) -> list[tuple[str, str]]:
    """(label, value) rows: what was compared, what was found, and whether observing changed anything."""
    m = loc.model if isinstance(loc.model, dict) else {}
    lg = loc.logits
    flip = f"flips ({lg.argmax_single} -> {lg.argmax_batched})" if lg.flips else f"the same ({lg.argmax_single})"
    rows = [
        ("found", loc.where()),
        ("target", f"{text(loc.target)} ({text(m.get('quantization'))})"),
        ("settings", settings_label(loc.settings) or "the defaults"),
        ("threads used", text(loc.threads_used) if loc.threads_used is not None else "not recorded"),
        ("compared", f"token {loc.position} (KV position {loc.n_prompt + loc.position - 1}) as row {loc.row} of a "
                     f"width-{loc.width} pass against the single-token pass"
                     + (", the trace's fork" if loc.source == "trace" else "")),
        ("nodes", f"{len(loc.nodes)} observed per pass ({loc.selection}); {loc.count('identical') + loc.count('differs')}"
                  f" compared, {loc.count('differs')} differ, {loc.count('skipped')} skipped"),
        ("observer check", "observing changed nothing: both passes' logits equal an unobserved context's, bit for bit"
         if loc.observer_exact else "OBSERVING CHANGED THE LOGITS: the nodes may not be what an unobserved pass "
         "computes"),
        ("logits", f"{lg.n_diff} of {lg.n_vocab} differ, max |Δ| {_g(lg.max_abs)}; argmax {flip}; single-token top-2 "
                   f"gap {_g(lg.margin_single)}"),
    ]
    if loc.seconds.get("total") is not None:
        rows.append(("time", f"{loc.seconds['total']:.1f} s"))
    return rows + [("note", n) for n in loc.notes]


def growth_rows(loc: Any) -> list[list[str]]:
    return [[a["part"], _g(a["out"]), _g(a["max"]), f"{a['differ']} / {a['compared']}", a["first"] or ""]
            for a in loc.per_layer() if a["compared"]]


def locate_html(loc: Any, file: str | None, plots: Mapping[str, bytes]) -> str:
    parts = [f"<h1>specview locate: {esc(locate_title(loc, file))}</h1>",
             f"<div class=sub>specview {esc(__version__)} · engine {esc(loc.backend)}</div>",
             _kv_html(locate_facts(loc))]
    if loc.first is not None:
        parts.append("<h2>The first node that differs</h2>")
        parts.append(f"<pre>{esc(chr(10).join(describe(loc.first)))}</pre>")
    if PLOT in plots:
        title, cap = PLOT_CAPTIONS[PLOT]
        parts.append(f"<h2>{esc(title)}</h2>")
        parts.append(_img_html(plots[PLOT], title, cap))
    parts.append("<h2>How the difference grows</h2>")
    parts.append(_table_html(GROWTH_HEADERS, growth_rows(loc)))
    parts.append("<h2>Environment</h2>")
    parts.append(_kv_html(environment_facts({"backend": loc.backend, **{k: v for k, v in loc.model.items()
                                                                         if k in ("file", "path")}})))
    return _page("specview locate", "\n".join(parts))


def locate_markdown(loc: Any, file: str | None, plot_files: Mapping[str, str]) -> str:
    out = [f"## specview locate: {md_text(locate_title(loc, file))}\n", _kv_md(locate_facts(loc))]
    if loc.first is not None:
        out.append("### The first node that differs\n")
        out.append(md_fence("\n".join(describe(loc.first))) + "\n")
    if PLOT in plot_files:
        title, cap = PLOT_CAPTIONS[PLOT]
        out.append(f"### {md_text(title)}\n")
        out.append(f"![{title}]({plot_files[PLOT]})\n\n{md_text(cap)}\n")
    out.append("### How the difference grows\n")
    out.append(_table_md(GROWTH_HEADERS, growth_rows(loc)))
    out.append(f"<sub>Made with specview {md_text(__version__)}.</sub>\n")
    return "\n".join(out)


__all__ = ["GROWTH_HEADERS", "PLOT", "growth_rows", "locate_facts", "locate_html", "locate_markdown", "locate_title"]
