"""The fork card: one PNG, sized for a GitHub comment, that says what forked, why, and how to reproduce it.

The card is drawn by the app's own widgets offscreen, in the light theme, so it
looks like the app: the two arms' :class:`~specview.gui.panes.TokenPane` around
the fork with the first mismatched token marked as in the app, the verdict in
its colour from :mod:`specview.core.verdicts` with the serial-verify line and
the numbers behind it, the app's :class:`~specview.gui.plots.MarginPlot` zoomed
on the fork, and the settings that reproduce the run (models and their
quantizations, drafter, n_max, p_min, threads, backend devices).  When the
prompt came from a task suite (the trace's config has a ``quality`` block) a
line under the title says whether the answer changed, with the expected answer
and each arm's.  An identical
trace gets a card that says so, with the same settings.

:func:`fork_card_png` returns the PNG bytes; the Qt-free report writer takes it
as its card renderer (``specview report --card``).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QImage, QPixmap
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from ..core.diagnose import departure_line, serial_line
from ..core.report.escape import visible
from ..core.report.facts import cpu_features_text, repack_text, obj, trace_title, verdict_of
from ..core.report.quality import answer_line, changed
from ..core.verdicts import STRONG, WORDS
from .app import application
from .export import png_bytes
from .panes import TokenPane, Tints

#: the card's width, and the largest height it grows to (GitHub shows comment images up to about this size)
CARD_WIDTH, MAX_HEIGHT = 1200, 1000
PLOT_HEIGHT = 300
#: tokens shown before and after the fork
BEFORE, AFTER = 24, 16
#: text lines a pane may take on the card
PANE_LINES = 3
ZOOM_BEFORE, ZOOM_AFTER = 32, 16


def _palette():
    from .theme import light_palette

    return light_palette()


def fork_highlight() -> QColor:
    """The colour the card (like the app's panes in the light theme) marks the first mismatched token with."""
    return QColor(Tints(_palette()).mismatch)


def _esc(x: Any) -> str:
    return html.escape(visible(str(x)) if x is not None else "n/a")


def _num(x: Any, spec: str = ".4f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def _label(rich: str, *, mono: bool = False, size: float | None = None) -> QLabel:
    lab = QLabel(rich)
    lab.setTextFormat(Qt.TextFormat.RichText)
    lab.setWordWrap(True)
    if mono or size:
        f = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont) if mono else QFont(lab.font())
        if size:
            f.setPointSizeF(size)
        lab.setFont(f)
    return lab


# -- what the card says ----------------------------------------------------------------
def _model(trace: Any, role: str) -> str:
    m, cfg = obj(trace.models.get(role)), obj(trace.config)
    name = m.get("file") or cfg.get(role) or "?"
    q = m.get("quantization")
    return f"{name} ({q})" if q else str(name)


def _devices(trace: Any) -> str:
    env = obj(trace.environment)
    devs = [d for d in env.get("ggml_devices") or [] if isinstance(d, dict)]
    names = [f"{d.get('name')} ({d.get('description')})" if d.get("description") else str(d.get("name"))
             for d in devs]
    layers = obj(obj(trace.models.get("target")).get("layers_on"))
    out = ", ".join(names) or ", ".join(str(x) for x in env.get("ggml_backends") or []) or "n/a"
    if layers:
        out += "; target layers on " + ", ".join(f"{k} {v}" for k, v in layers.items())
    return out


def settings_rows(trace: Any) -> list[tuple[str, str]]:
    """(label, value) rows of the settings that reproduce the trace."""
    cfg, env = obj(trace.config), obj(trace.environment)
    eng = obj(cfg.get("engine"))
    spec = str(cfg.get("spec_type", "?"))
    threads = cfg.get("threads_used", eng.get("threads"))
    backend = env.get("backend") or cfg.get("backend") or "?"
    version = env.get("llama_cpp_python")
    rows = [("target", _model(trace, "target")),
            ("draft", _model(trace, "draft") if spec.startswith("draft") else "none (no draft model)"),
            ("spec type", spec),
            ("n_max / n_min / p_min", f"{cfg.get('n_max')} / {cfg.get('n_min')} / {cfg.get('p_min')}"),
            ("threads used", "all cores" if threads in (None, 0) else str(threads)),
            ("backend", f"{backend} {version}" if version else str(backend)),
            ("devices", _devices(trace)),
            ("flash attn / KV / GPU layers", f"{eng.get('flash_attn', 'n/a')} / {eng.get('kv_type', 'n/a')} / "
                                             f"{eng.get('gpu_layers', 'n/a')}"),
            ("max tokens / chat template", f"{cfg.get('max_tokens')} / {'yes' if cfg.get('chat') else 'no'}")]
    rows.append(("weight repack", repack_text(cfg, getattr(trace, "models", None))))
    if env.get("cpu"):
        feats = cpu_features_text(env)
        rows.append(("CPU", f"{env['cpu']} ({feats})" if feats else str(env["cpu"])))
    return rows


def verdict_lines(trace: Any) -> list[str]:
    """Plain lines: the serial-verify control, the fork's tokens, the gaps, where the verify pass first departs
    (a near-tie diagnosis' ``departure``), the envelope and thresholds."""
    c, d = trace.comparison, obj(trace.diagnosis)
    lines: list[str] = []
    sv = serial_line(obj(d.get("serial_verify")) or None)
    if sv:
        lines.append(" ".join(sv.split()))
    if c.identical:
        return lines
    fm = c.first_mismatch
    lines.append(f"fork at token {fm.index} (character {fm.char_offset}): vanilla {fm.vanilla_token} "
                 f"'{visible(fm.vanilla_piece or '')}', speculative {fm.speculative_token} "
                 f"'{visible(fm.speculative_piece or '')}'; {c.agree} tokens agree before it")
    i = fm.index
    bits = []
    if d.get("gap") is not None:
        bits.append(f"gap (one token per pass) {_num(d['gap'])} logits for the vanilla token")
    sp = obj(obj(d.get("replays")).get("speculative"))
    if isinstance(sp.get("gap"), (int, float)):
        bits.append(f"{_num(sp['gap'])} for the speculative token in {sp.get('shape', 'the verify pass')}")
    if not bits and i < len(trace.vanilla.steps):
        bits.append(f"vanilla top-1/top-2 margin at the fork {_num(trace.vanilla.steps[i].margin)} logits")
    if bits:
        lines.append("; ".join(bits))
    dep = departure_line(d.get("departure"))
    if dep:
        lines.append(dep)
    env, th = obj(d.get("envelope")), obj(d.get("thresholds"))
    if env.get("max") is not None:
        far = f"; state bug above {_num(th['far'])}" if th.get("far") is not None else ""
        lines.append(f"envelope before the fork: max {_num(env.get('max'))}, p95 {_num(env.get('p95'))} logits over "
                     f"{env.get('positions', '?')} positions{far}")
    if not d:
        lines.append("not diagnosed: specview run --diagnose explains the fork")
    elif d.get("rule"):
        lines.append(f"rule {d['rule']}")
    return lines


# -- the widgets -------------------------------------------------------------------------
def _pane(steps: list, fork: int | None, width: int, palette) -> TokenPane:
    pane = TokenPane("card")
    pane.setPalette(palette)
    pane.tints = Tints(palette)
    pane.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    pane.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    pane.setFixedWidth(width)
    pane.set_steps(steps)
    pane.set_mismatch(fork)
    doc = pane.document()
    doc.setTextWidth(pane.viewport().width() if pane.viewport().width() > 50 else width - 8)
    line = pane.fontMetrics().lineSpacing()
    frame = 2 * pane.frameWidth() + 2 * int(doc.documentMargin())
    pane.setFixedHeight(min(int(doc.size().height()), PANE_LINES * line + 2 * int(doc.documentMargin())) + frame)
    return pane


def _plot_pixmap(trace: Any, width: int) -> QPixmap:
    """The app's margin plot, zoomed on the fork (the whole run when there is none), as an image."""
    from .export import margin_plot, render_image

    fm = trace.comparison.first_mismatch
    n = max(len(trace.vanilla.steps), len(trace.speculative.steps))
    xrange = title = None
    if fm is not None and n > 0:
        lo, hi = max(0, fm.index - ZOOM_BEFORE), min(n - 1, fm.index + ZOOM_AFTER)
        if hi > lo:
            xrange, title = (lo, hi), f"top-1 minus top-2 logit per token, tokens {lo} to {hi} around the fork"
    return QPixmap.fromImage(render_image(margin_plot(trace, xrange, title), width, PLOT_HEIGHT))


class ForkCard(QWidget):
    """The card's widgets for one trace, laid out at :data:`CARD_WIDTH`."""

    def __init__(self, trace: Any):
        super().__init__()
        pal = _palette()
        self.setPalette(pal)
        self.setAutoFillBackground(True)
        self.setFixedWidth(CARD_WIDTH)
        inner = CARD_WIDTH - 32
        lay = QVBoxLayout(self)
        lay.setContentsMargins(16, 14, 16, 12)
        lay.setSpacing(8)
        c = trace.comparison
        v = "identical" if c.identical else verdict_of(trace)
        colour = STRONG.get(v, STRONG["diverged"])
        if c.identical:
            big = f"IDENTICAL over {c.agree} tokens"
            sub = "speculative decoding gave exactly the tokens plain greedy decoding gave"
        else:
            big = f"{v.upper()} at token {c.first_mismatch.index}"
            sub = WORDS.get(v, v)
        self.header = _label(f'<span style="color:{colour}; font-size:17pt; font-weight:bold">{_esc(big)}</span>'
                             f'&nbsp;&nbsp;<span style="font-size:11pt">{_esc(sub)}</span>')
        lay.addWidget(self.header)
        lay.addWidget(_label(f"<b>{_esc(trace_title(trace))}</b>", size=10.5))
        self.task: QLabel | None = None
        task = answer_line(trace)
        if task is not None:  # the prompt came from a task suite: whether the fork changed the answer comes first
            tint = STRONG["state"] if changed(trace) else STRONG["identical"]
            self.task = _label(f'<span style="color:{tint}; font-weight:bold">{_esc(task)}</span>', size=10.5)
            self.task.setObjectName("card_task")
            lay.addWidget(self.task)
        self.panes: list[TokenPane] = []
        if not c.identical:
            lay.addLayout(self._fork_texts(trace, inner - 110, pal))
        lines = verdict_lines(trace)
        if lines:
            self.numbers = _label("<br>".join(_esc(x) for x in lines), mono=True, size=9)
            lay.addWidget(self.numbers)
        plot = QLabel()
        plot.setPixmap(_plot_pixmap(trace, inner))
        lay.addWidget(plot)
        lay.addWidget(self._settings(trace))
        env = obj(trace.environment)
        lay.addWidget(_label(f'<span style="color:#666">specview {_esc(env.get("specview", "?"))} · '
                             f'{_esc(env.get("created", ""))} · <i>specview report TRACE.json</i> gives the full '
                             f'report</span>', size=8.5))

    def _fork_texts(self, trace: Any, width: int, pal) -> QGridLayout:
        i = trace.comparison.first_mismatch.index
        lo = max(0, i - BEFORE)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(4)
        for row, (name, arm) in enumerate((("vanilla", trace.vanilla), ("speculative", trace.speculative))):
            steps = list(arm.steps[lo:i + 1 + AFTER])
            pane = _pane(steps, i - lo if i < len(arm.steps) else None, width, pal)
            self.panes.append(pane)
            where = f"tokens {lo}–{lo + len(steps) - 1}"
            grid.addWidget(_label(f"<b>{name}</b><br><span style='color:#666'>{_esc(where)}</span>", size=9), row, 0,
                           Qt.AlignmentFlag.AlignTop)
            grid.addWidget(pane, row, 1)
        note = ("marked: the first token the arms disagree on; tinted: accepted draft tokens")
        grid.addWidget(_label(f"<span style='color:#666'>{_esc(note)}</span>", size=8.5), 2, 1)
        return grid

    def _settings(self, trace: Any) -> QLabel:
        rows = settings_rows(trace)
        half = (len(rows) + 1) // 2
        cells = []
        for k in range(half):
            pair = rows[k:k + 1] + rows[half + k:half + k + 1]
            tds = "".join(f"<td style='color:#555; padding-right:8px'>{_esc(a)}</td>"
                          f"<td style='padding-right:24px'>{_esc(b)}</td>" for a, b in pair)
            cells.append(f"<tr>{tds}</tr>")
        return _label("<b>Settings that reproduce it</b><table cellspacing='0' cellpadding='1'>"
                      + "".join(cells) + "</table>", size=9)


def card_image(trace: Any) -> QImage:
    """The card of ``trace``, painted at one image pixel per widget pixel (whatever the screen's scale)."""
    application(offscreen=True)
    card = ForkCard(trace)
    card.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)
    card.show()
    card.layout().activate()
    card.adjustSize()
    h = min(card.sizeHint().height(), MAX_HEIGHT)
    card.resize(CARD_WIDTH, h)
    image = QImage(CARD_WIDTH, h, QImage.Format.Format_RGB32)
    image.fill(card.palette().color(card.backgroundRole()))
    try:
        card.render(image)
    finally:
        card.close()
        card.deleteLater()
    return image


def fork_card_png(trace: Any) -> bytes:
    """The fork card of ``trace`` as PNG bytes (about 1200 pixels wide, at most 1000 high)."""
    return png_bytes(card_image(trace))


def export_card(window: Any, path: str | Path) -> Path | None:
    """File ▸ Export fork card: write the card of the trace on screen to ``path`` and put it on the clipboard."""
    from PySide6.QtGui import QGuiApplication

    if window.trace is None:
        window.show_error("no trace to draw a fork card of yet: run both arms or open a saved trace first")
        return None
    image = card_image(window.trace)
    p = Path(path)
    try:
        p.write_bytes(png_bytes(image))
    except OSError as exc:
        window.show_error(f"{p}: could not write the fork card ({exc})")
        return None
    QGuiApplication.clipboard().setImage(image)
    window.show_status(f"fork card written to {p} and copied to the clipboard")
    return p


def export_card_dialog(window: Any) -> None:
    from PySide6.QtWidgets import QFileDialog

    path, _ = QFileDialog.getSaveFileName(window, "Save the fork card", str(Path.cwd() / "fork-card.png"),
                                          "PNG images (*.png)")
    if path:
        export_card(window, path)


__all__ = ["export_card", "export_card_dialog", "ForkCard", "card_image", "fork_card_png", "fork_highlight", "settings_rows", "verdict_lines",
           "CARD_WIDTH", "MAX_HEIGHT"]
