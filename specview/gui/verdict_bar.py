"""The verdict bar: what a run, a saved trace or a matrix showed, in words, tinted by its verdict.

The words and colours of verdicts come from :mod:`specview.core.verdicts`, as
in the CLI, the matrix grid and the reports.  After an identical run the bar
says, in one line, what to try next to look for a fork on this machine; each
suggestion is a link that sets the control and runs again.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QWidget

from ..core import verdicts
from ..core.trace import Step, Trace
from .panes import MISMATCH_HUE, blend, is_dark

#: what a bar's kind stands for, as a verdict category (its colour); "error" is the panes' mismatch red
KIND_CATEGORY = {"ok": "identical", "warn": "near-tie", "bad": "state", "unsure": "inconclusive"}
TRY_SCHEME = "try:"
#: demo quantizations, the ones whose kernels most often flip a near-tie first
FORKY_DEMOS = ("demo:Q4_K_M", "demo:BF16", "demo:F16", "demo:Q8_0")
LONG_RUN = 1024
WIDE_N_MAX = 8


def fmt_margin(x: Any) -> str:
    """A margin as the app shows it; "n/a" where the engine reported none (llama-server)."""
    if x is None:
        return "n/a"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return f"{v:.4f}" if math.isfinite(v) else "n/a"


def step_origin(step: Step) -> str:
    """Where a speculative token came from, in words; "n/a" for what the engine did not report."""
    if step.from_draft is None:
        origin = "origin n/a"
    else:
        origin = "accepted draft token" if step.from_draft else "target's own token"
    rnd = "n/a" if step.round is None else step.round
    t = "n/a" if step.batch_size is None else step.batch_size
    return f"{origin}, round {rnd}, batch T={t}"


def diagnosis_verdict(diag: dict | None) -> str | None:
    """The diagnosis' verdict as one of :data:`verdicts.VERDICTS` (``near_tie`` spelled either way), else None."""
    v = diag.get("verdict") if isinstance(diag, dict) else None
    if not isinstance(v, str) or not v:
        return None
    v = v.lower().replace("_", "-")
    return "state" if v == "state-bug" else v


def diagnosis_tooltip(diag: dict | None) -> str:
    if not diag:
        return ""
    lines = []
    for k, v in diag.items():
        if k == "envelope" and isinstance(v, dict):
            v = {kk: vv for kk, vv in v.items() if kk != "series"}
        if isinstance(v, (list, dict)):
            text = json.dumps(v)
            if len(text) > 160:
                text = text[:157] + "…"
        else:
            text = str(v)
        lines.append(f"<b>{html.escape(str(k))}</b>: {html.escape(text)}")
    return "<br>".join(lines)


def speed_text(trace: Trace) -> str:
    v, s = trace.vanilla, trace.speculative
    vt, st = v.tokens_per_s, s.tokens_per_s
    bits = [f"vanilla <b>{vt:.1f}</b> tok/s", f"speculative <b>{st:.1f}</b> tok/s"]
    if vt > 0 and st > 0:
        bits.append(f"speedup <b>{st / vt:.2f}×</b>")
    rate = s.acceptance_rate
    if rate is not None:
        bits.append(f"acceptance {rate * 100:.1f}% ({s.n_accepted}/{s.n_drafted})")
    if s.mean_accepted is not None:
        bits.append(f"mean accepted length {s.mean_accepted:.2f}")
    models = trace.models if isinstance(trace.models, dict) else {}
    tgt = models.get("target") if isinstance(models.get("target"), dict) else {}
    drf = models.get("draft") if isinstance(models.get("draft"), dict) else {}
    who = tgt.get("file") or trace.config.get("target")
    if who:
        desc = f"target {html.escape(str(who))}"
        if drf.get("file"):
            desc += f", draft {html.escape(str(drf['file']))}"
        elif s.drafter:
            desc += f", drafter {html.escape(str(s.drafter))}"
        bits.append(desc)
    return " · ".join(bits)


SAVE_CRASH_LINK = "specview:save-crash"
LOCATE_LINK = "specview:locate"  # the link to the Locate tab


def crash_text(message: str, crash: dict[str, Any], *, kept_tokens: int = 0) -> str:
    """The verdict bar after the engine's worker died: what happened, the retry as one click, the run kept."""
    lines = [html.escape(ln) for ln in message.splitlines()]
    head = f"<b>The engine crashed</b>: {lines[0] if lines else ''}"
    body = "<br>".join(lines[1:])
    links = []
    kc = crash.get("known_cause") or {}
    retry = kc.get("retry")
    if retry:
        flags = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in retry.items())
        links.append(try_link(dict(retry), f"Retry with {flags}"))
    links.append(try_link({}, "Run again"))
    if kept_tokens:
        links.append(f"<a href=\"{SAVE_CRASH_LINK}\">Save the crashed run ({kept_tokens} tokens) as a trace…</a>")
    return head + ("<br>" + body if body else "") + "<br>" + " · ".join(links) + \
        "<br><i>The settings and the last finished run stay as they were.</i>"


# -- what to try after an identical run -----------------------------------------------------
def try_link(settings: dict[str, Any], text: str) -> str:
    return f"<a href=\"{TRY_SCHEME}{quote(json.dumps(settings, sort_keys=True))}\">{html.escape(text)}</a>"


def parse_try_link(href: str) -> dict[str, Any] | None:
    """The settings a "try" link sets, or None for any other link."""
    if not href.startswith(TRY_SCHEME):
        return None
    try:
        d = json.loads(unquote(href[len(TRY_SCHEME):]))
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def next_steps(trace: Trace, other_quants: list[str] | None = None) -> str:
    """One line after an identical run: what to try next to look for a fork on this machine (links)."""
    cfg = trace.config if isinstance(trace.config, dict) else {}
    s = trace.speculative
    if s.n_drafted == 0 and (s.rounds or s.reported_drafted is not None):
        if cfg.get("spec_type") == "none":
            return "Nothing was drafted, so the arms could not differ: " + try_link(
                {"spec_type": "draft-simple"}, "use a draft model") + "."
        if isinstance(cfg.get("p_min"), (int, float)) and cfg["p_min"] >= 1:
            return "Nothing was drafted (p_min 1), so the arms could not differ: " + try_link(
                {"p_min": 0.0}, "draft again (p_min 0)") + "."
    tries: list[str] = []
    target = str(cfg.get("target") or "")
    quants = [q for q in (other_quants or []) if q and q != target]
    if not quants and target.lower().startswith("demo:"):
        quants = [q for q in FORKY_DEMOS if q.lower() != target.lower()]
    if quants:
        label = quants[0].split(":", 1)[1] if quants[0].startswith("demo:") else quants[0].rsplit("/", 1)[-1]
        tries.append(try_link({"target": quants[0]}, f"another quantization ({label})"))
    else:
        tries.append("another quantization of the target")
    n = int(cfg.get("max_tokens") or 0)
    longer: dict[str, Any] = {"max_tokens": max(LONG_RUN, 2 * n)}
    stopped_early = trace.vanilla.stop_reason not in ("max_tokens", "cancelled") and len(trace.vanilla.tokens) < n
    if stopped_early and not cfg.get("ignore_eos"):
        longer["ignore_eos"] = True
    tries.append(try_link(longer, f"a longer run ({longer['max_tokens']} tokens"
                          + (", ignoring EOS)" if "ignore_eos" in longer else ")")))
    if cfg.get("spec_type") not in ("ngram-simple", "none"):
        wide = max(WIDE_N_MAX, 2 * int(cfg.get("n_max") or 0))
        tries.append(try_link({"n_max": wide}, f"a larger n_max ({wide})"))
    return "No fork here. To look for one on this machine, try " + ", ".join(tries[:-1]) + " or " + tries[-1] + "."


# -- the bar --------------------------------------------------------------------------------------
def backend_failure(diag: dict | None) -> str | None:
    """The bar's first line when the diagnosis' backend check flagged this build as broken, else None.

    A broken backend (a GPU build whose logits are far from the CPU's) makes every
    other line of the bar moot, so it is said first, in bold, with its figures.
    """
    ref = diag.get("reference") if isinstance(diag, dict) else None
    if not isinstance(ref, dict) or ref.get("ok") is not False:
        return None
    t = ref.get("totals") if isinstance(ref.get("totals"), dict) else {}
    kl, top1 = t.get("kl_mean"), t.get("same_top1")
    nums = []
    if isinstance(kl, (int, float)) and math.isfinite(kl):
        nums.append(f"mean KL {kl:.2e} nats")
    if isinstance(top1, (int, float)) and math.isfinite(top1):
        nums.append(f"same top-1 at {top1:.1%} of positions")
    problems = [str(p) for p in ref.get("problems") or [] if p]
    who = " against ".join(str(ref.get(k)) for k in ("test_label", "reference_label") if ref.get(k))
    detail = "; ".join(([who] if who else []) + (problems or nums))  # the problems carry their own figures
    return (f"<b>Backend check failed</b>{': ' + html.escape(detail) if detail else ''}. This build does not "
            "compute the model as the reference does: read nothing into a fork until the backend is fixed "
            "(<code>specview check</code> repeats the comparison).")


def kernel_line(pred: Any, trace: Trace) -> tuple[str, bool]:
    """(rich text, contradiction?) of what the kernel map shown in the app says about ``trace``'s run.

    ``pred`` is a :class:`~specview.core.kernels.evidence.KernelPrediction`.  A fork
    in a run the map proves lossless contradicts it: that line is the loud one.
    """
    from ..core.kernels.evidence import DIFFER, NOT_COVERED, NOT_DETERMINISTIC, contradiction_text

    e = html.escape
    c = trace.comparison
    name = e(Path(pred.map_file).name) if pred.map_file else "the kernel map shown"
    if pred.contradicts(c.identical):
        fm = c.first_mismatch
        text = contradiction_text(pred, where="this run", fork=fm.index if fm else None,
                                  pieces=(fm.vanilla_piece, fm.speculative_piece) if fm else None)
        return f"<b>Kernel map {name}</b>: {e(text)}", True
    if pred.status == NOT_COVERED:
        return f"<i>Kernel map {name}: {e(pred.reason or pred.words)}.</i>", False
    if pred.status == NOT_DETERMINISTIC:
        return f"Kernel map {name}: {e(pred.reason or pred.words)}.", False
    tail = ""
    if pred.status == DIFFER:
        tail = (" This fork is what those kernels make possible." if not c.identical else
                " This run stayed identical, but another prompt may fork.")
    else:
        tail = " This run is identical, as the map predicts."
    caveats = f" Caveat: {e('; '.join(pred.caveats))}." if pred.caveats else ""
    return f"Kernel map {name}: {e(pred.text())}.{tail}{caveats}", False


def trace_verdict(trace: Trace, *, cancelled: bool = False, diagnosis_error: str | None = None,
                  diag_note: str = "", n_diffs: int = 0, other_quants: list[str] | None = None,
                  kernel: Any = None) -> tuple[str, str]:
    """(rich text, kind) of a finished or opened trace; ``kernel``: the kernel map's prediction for its run."""
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    fm = c.first_mismatch
    diag = trace.diagnosis if isinstance(trace.diagnosis, dict) else None
    verdict = diagnosis_verdict(diag)
    parts: list[str] = []
    broken = backend_failure(diag)
    if broken:
        parts.append(broken)
    if cancelled:
        kind = "warn"
        parts.append(f"<b>Cancelled</b> after {len(v.tokens)} vanilla and {len(s.tokens)} speculative tokens.")
        if fm is not None and fm.index < min(len(v.tokens), len(s.tokens)):
            parts.append(f"The arms already differ at token {fm.index}.")
    elif c.identical:
        kind = "ok"
        parts.append(f"<b>Identical</b>: both arms produced the same {c.n_vanilla} tokens.")
        parts.append(next_steps(trace, other_quants))
    else:
        # amber for a near-tie (expected numerics), red for a state bug, nondeterminism or no diagnosis,
        # the same colours as the matrix grid and the report
        kind = {"near-tie": "warn", "inconclusive": "unsure"}.get(verdict or "", "bad")
        i = fm.index
        vm = v.steps[i].margin if i < len(v.steps) else None
        sm = s.steps[i] if i < len(s.steps) else None
        what = (f"<b>Forked at token {i}</b>: vanilla {html.escape(repr(fm.vanilla_piece))} vs speculative "
                f"{html.escape(repr(fm.speculative_piece))}")
        if verdict:
            what += f" — <b>{html.escape(verdicts.words(verdict))}</b>"
        parts.append(what + ".")
        nums = [f"vanilla margin {fmt_margin(vm)}"]
        if sm is not None:
            nums.append(f"speculative margin {fmt_margin(sm.margin)} ({step_origin(sm)})")
        gap = diag.get("gap") if diag else None
        if isinstance(gap, (int, float)) and math.isfinite(gap):
            nums.append(f"replay gap {gap:.4f}")
        nums.append(f"{c.agree} tokens agree; {n_diffs} differing positions")
        parts.append(" · ".join(nums))
    if broken:
        kind = "bad"  # whatever the arms did, a backend that computes the model wrongly comes first
    if diagnosis_error:
        parts.append(f"<i>diagnosis failed: {html.escape(diagnosis_error)}</i>")
    elif diag:
        expl = diag.get("explanation")
        if isinstance(expl, str) and expl.strip():
            parts.append(f"<i>{html.escape(expl.strip())}</i>")
        elif diag_note:
            parts.append(f"<i>diagnosis: {html.escape(diag_note)}</i>")
    if kernel is not None and not cancelled:
        line, contradiction = kernel_line(kernel, trace)
        parts.append(line)
        if contradiction:
            kind = "bad"
    return "<br>".join(parts), kind


def matrix_verdict(doc: dict[str, Any]) -> tuple[str, str]:
    """(rich text, kind) of a matrix document, finished, running or interrupted."""
    cells = doc.get("cells", [])
    n, total = len(cells), doc.get("n_cells", len(cells))
    forks = sum(1 for c in cells if c.get("status") == "ok" and not c.get("identical"))
    errors = sum(1 for c in cells if c.get("status") == "error")
    status = doc.get("status", "")
    head = {"interrupted": "Matrix cancelled", "running": "Matrix still running"}.get(status, "Matrix complete")
    text = f"<b>{head}</b>: {n} of {total} cells, {forks} forked, {errors} failed."
    if n:
        text += "<br><i>Double-click a cell (or press Enter on it) to open it side by side.</i>"
    # a near-tie fork is expected numerics, not a bug: only a state bug, nondeterminism or an
    # undiagnosed fork colours the bar as a mismatch
    bad = any(verdicts.category(c) in ("state", "nondeterministic", "diverged") for c in cells)
    return text, "bad" if bad else ("warn" if forks or errors or status != "complete" else "ok")


class VerdictBar(QLabel):
    """A rich-text line or two, its background tinted by the verdict's colour."""

    sigTry = Signal(dict)  # the settings a "try" link sets
    sigSaveCrash = Signal()  # the "save the crashed run" link
    sigLocate = Signal()  # the "show it along the graph" link of a located departure

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("verdict")
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setMargin(6)
        self.setAutoFillBackground(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self.linkActivated.connect(self._link)
        self.kind = "info"
        self._palette_key: int | None = None

    def show_text(self, text: str, kind: str) -> None:
        """Show ``text`` tinted for ``kind``: info, ok, warn, bad, unsure or error."""
        pal = self.window().palette() if self.window() is not None else self.palette()
        if kind == self.kind and self._palette_key == pal.cacheKey():
            if text != self.text():
                self.setText(text)
            return
        self._palette_key = pal.cacheKey()
        base = pal.color(QPalette.ColorRole.Window)
        if kind == "error":
            hue: QColor | None = MISMATCH_HUE
        elif kind in KIND_CATEGORY:
            hue = QColor(verdicts.STRONG[KIND_CATEGORY[kind]])
        else:
            hue = None
        bg = blend(base, hue, 0.30 if is_dark(pal) else 0.22) if hue is not None else base
        vp = self.palette()
        vp.setColor(QPalette.ColorRole.Window, bg)
        vp.setColor(QPalette.ColorRole.WindowText, pal.color(QPalette.ColorRole.WindowText))
        vp.setColor(QPalette.ColorRole.Link, pal.color(QPalette.ColorRole.Link))
        self.setPalette(vp)
        self.setText(text)
        self.kind = kind

    def repaint_theme(self) -> None:
        """Re-tint after the theme changed."""
        self._palette_key = None
        kind, self.kind = self.kind, ""
        self.show_text(self.text(), kind)

    def _link(self, href: str) -> None:
        if href == SAVE_CRASH_LINK:
            self.sigSaveCrash.emit()
            return
        if href == LOCATE_LINK:
            self.sigLocate.emit()
            return
        settings = parse_try_link(href)
        if settings is not None:  # {}: run again as it is
            self.sigTry.emit(settings)
