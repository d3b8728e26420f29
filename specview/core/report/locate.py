"""The report of a locate (``specview.locate/1``): where the batched pass first departs, the plot, the growth.

Qt-free: the |Δ|-along-the-graph plot arrives as PNG bytes from the renderer
the writer was given (the app's own plot widget, :mod:`specview.gui.locate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Mapping

from ... import __version__
from ..config import settings_label
from ..locate.text import describe
from .escape import esc, md_text, text
from .html import HtmlWriter, _page
from .markdown import MarkdownWriter, made_with
from .outline import Section, environment_section, plot_sections

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


def locate_sections(loc: Any, plots: Collection[str]) -> list[Section]:
    """The report of a locate, after its title: what was compared, the first node that differs, the growth."""
    out = [Section("facts", locate_facts(loc))]
    if loc.first is not None:
        out.append(Section("code", "\n".join(describe(loc.first)), "The first node that differs"))
    out += plot_sections([PLOT] if PLOT in plots else [])
    out.append(Section("table", (GROWTH_HEADERS, growth_rows(loc)), "How the difference grows"))
    out.append(environment_section({"backend": loc.backend, **{k: v for k, v in loc.model.items()
                                                               if k in ("file", "path")}}, markdown=False))
    return out


def locate_html(loc: Any, file: str | None, plots: Mapping[str, bytes]) -> str:
    parts = [f"<h1>specview locate: {esc(locate_title(loc, file))}</h1>",
             f"<div class=sub>specview {esc(__version__)} · engine {esc(loc.backend)}</div>"]
    parts += HtmlWriter(plots).draw(locate_sections(loc, plots))
    return _page("specview locate", "\n".join(parts))


def locate_markdown(loc: Any, file: str | None, plot_files: Mapping[str, str]) -> str:
    out = [f"## specview locate: {md_text(locate_title(loc, file))}\n"]
    out += MarkdownWriter(plot_files).draw(locate_sections(loc, plot_files))
    out.append(made_with(__version__))
    return "\n".join(out)


__all__ = ["GROWTH_HEADERS", "PLOT", "growth_rows", "locate_facts", "locate_html", "locate_markdown", "locate_sections",
           "locate_title"]
