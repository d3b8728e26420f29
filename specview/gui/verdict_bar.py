"""The verdict bar: what a run, a saved trace or a matrix showed, in words, tinted by its verdict.

The words and colours of verdicts come from :mod:`specview.core.verdicts`, as
in the CLI, the matrix grid and the reports.  After an identical run the bar
says, in one line, what to try next to look for a fork on this machine; each
suggestion is a link that sets the control and runs again.  A run that drafted
nothing tested nothing speculative: it is inconclusive (grey), and its one link
is the change that makes it draft.  A serial-verify run tested the loop but no
batched verify pass: its link is the same run without serial verify.
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
from ..core.diagnose.words import batched_again, drafted_nothing, single_row_verify, zero_draft
from ..core.matrix.summary import cell_category, cell_drafted_nothing
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


def _arm_speed(name: str, arm: Any) -> str:
    """ "vanilla <b>146.5</b> tok/s", or what stands in for a speed an arm does not have."""
    if not arm.tokens:
        return f"{name}: no tokens"
    if arm.tokens_per_s <= 0:
        return f"{name}: {len(arm.tokens)} tokens, speed n/a"
    return f"{name} <b>{arm.tokens_per_s:.1f}</b> tok/s"


def speed_text(trace: Trace) -> str:
    v, s = trace.vanilla, trace.speculative
    vt, st = v.tokens_per_s, s.tokens_per_s
    bits = [_arm_speed("vanilla", v), _arm_speed("speculative", s)]
    if vt > 0 and st > 0:
        bits.append(f"speedup <b>{st / vt:.2f}×</b>")
    rate = s.acceptance_rate
    if rate is not None:
        bits.append(f"acceptance {rate * 100:.1f}% ({s.n_accepted}/{s.n_drafted})")
    if s.mean_accepted is not None:
        bits.append(f"mean {s.mean_accepted:.2f} tokens/round")  # the acceptance plot's words for it
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
    """One line after an identical run: what to try next to test speculative decoding (links).

    A run that drafted nothing gets the one change that makes it draft; a run whose every verify row was its
    own single-token pass (serial verify, -ub 1) gets the same run with batched verify passes; any other the
    settings most likely to find a fork on this machine.
    """
    cfg = trace.config if isinstance(trace.config, dict) else {}
    if drafted_nothing(trace):
        z = zero_draft(cfg)
        step = try_link(z.settings, f"{z.fix} and run again") if z.settings else html.escape(z.fix)
        return f"To test speculative decoding, {step}."
    how = single_row_verify(trace)
    if how:
        step, settings = batched_again(how)
        return f"To test batched verification, {try_link(settings, step)}."
    return "No fork here. To look for one on this machine, try " + _or_list(_fork_tries(trace, other_quants)) + "."


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _fork_tries(trace: Trace, other_quants: list[str] | None) -> list[str]:
    """The links most likely to find a fork after an identical run: another quantization, a longer run, a
    larger n_max."""
    cfg = trace.config if isinstance(trace.config, dict) else {}
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
    return tries


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
    from ..core.kernels.evidence import NOT_COVERED, contradiction_text

    e = html.escape
    c = trace.comparison
    label = f"Kernel map {e(Path(pred.map_file).name)}" if pred.map_file else "Kernel map (not saved)"
    if pred.contradicts(c.identical):
        fm = c.first_mismatch
        text = contradiction_text(pred, where="this run", fork=fm.index if fm else None,
                                  pieces=(fm.vanilla_piece, fm.speculative_piece) if fm else None)
        return f"<b>{label}</b>: {e(text)}", True
    caveats = f" Caveat: {e('; '.join(pred.caveats))}." if pred.caveats else ""
    line = f"{label}: {e(_kernel_sentence(pred, c.identical))}.{caveats}"
    return (f"<i>{line}</i>" if pred.status == NOT_COVERED else line), False


def _kernel_sentence(pred: Any, identical: bool) -> str:
    """What the map says of a run it does not contradict, as one sentence (without its full stop)."""
    from ..core.kernels.evidence import DIFFER, PROVEN
    from ..core.kernels.text import ranges

    widths = [w for w in pred.widths if isinstance(w, int)]
    span = ("width 1 (every verify row its own single-token pass)" if widths == [1]
            else f"widths {ranges(widths)} (n_max {pred.n_max})")
    row = pred.row or pred.target
    if pred.status == PROVEN:
        evidence = f" ({pred.evidence})" if pred.evidence else ""
        return (f"proven lossless for this run, since for {row} the verify passes at {span} compute bit-identically "
                f"to single-token passes{evidence}; this run is identical, as the map predicts")
    if pred.status == DIFFER:
        found = _differ_words(pred, row, span) if pred.first_differing is not None else (pred.reason or pred.words)
        return found + (", so this fork is what those kernels make possible" if not identical else
                        ", so a fork is possible; this run stayed identical, but another prompt may fork")
    return pred.reason or pred.words


def _differ_words(pred: Any, row: str, span: str) -> str:
    """ "kernels differ from single-token passes at width 4 for ROW (0.0% of its rows bit-identical, ...), within
    the widths 1-4 (n_max 3) this run verifies at" """
    nums = []
    if pred.identical_share is not None:
        nums.append(f"{100 * pred.identical_share:.1f}% of its rows bit-identical")
    if pred.max_delta is not None:
        nums.append(f"max |Δ| {pred.max_delta:.4g} logits")
    if pred.flips is not None:
        nums.append(f"{pred.flips} argmax flip{'s' if pred.flips != 1 else ''}")
    return (f"kernels differ from single-token passes at width {pred.first_differing} for {row}"
            + (f" ({', '.join(nums)})" if nums else "") + f", within the {span} this run verifies at")


#: what the model worker gives as the diagnosis error when the user cancelled the diagnosis alone (both arms had
#: finished): the run stands, its fork is not classified
DIAGNOSIS_CANCELLED = "diagnosis cancelled by the user"


def _identical_head(trace: Trace, other_quants: list[str] | None) -> tuple[list[str], str]:
    """(lines, kind) of an identical run: inconclusive when nothing was drafted, and what to try next."""
    c = trace.comparison
    if drafted_nothing(trace):
        why = html.escape(zero_draft(trace.config).why)
        head = (f"<b>Inconclusive</b>: both arms produced the same {c.n_vanilla} tokens, but the speculative arm "
                f"drafted nothing ({why}), so nothing speculative was tested.")
        return [head, next_steps(trace, other_quants)], "unsure"
    how = single_row_verify(trace)
    if how:
        head = (f"<b>Identical</b> with {html.escape(how)}: both arms produced the same {c.n_vanilla} tokens. "
                "Every verify row was its own single-token pass, so this tested the speculative loop but not "
                "batched verification.")
        return [head, next_steps(trace, other_quants)], "ok"
    return [f"<b>Identical</b>: both arms produced the same {c.n_vanilla} tokens.",
            next_steps(trace, other_quants)], "ok"


def _fork_head(trace: Trace, verdict: str | None, n_diffs: int) -> tuple[list[str], str]:
    """(lines, kind) of a forked run: where, its verdict and the numbers at the fork.  Amber for a near-tie
    (expected numerics), grey for inconclusive, red for a state bug, nondeterminism or no diagnosis: the same
    colours as the matrix grid and the report."""
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    diag = trace.diagnosis if isinstance(trace.diagnosis, dict) else None
    fm = c.first_mismatch
    kind = {"near-tie": "warn", "inconclusive": "unsure"}.get(verdict or "", "bad")
    i = fm.index
    vm = v.steps[i].margin if i < len(v.steps) else None
    sm = s.steps[i] if i < len(s.steps) else None
    what = (f"<b>Forked at token {i}</b>: vanilla {html.escape(repr(fm.vanilla_piece))} vs speculative "
            f"{html.escape(repr(fm.speculative_piece))}")
    if verdict:
        what += f" — <b>{html.escape(verdicts.words(verdict))}</b>"
    nums = [f"vanilla margin {fmt_margin(vm)}"]
    if sm is not None:
        nums.append(f"speculative margin {fmt_margin(sm.margin)} ({step_origin(sm)})")
    gap = diag.get("gap") if diag else None
    if isinstance(gap, (int, float)) and math.isfinite(gap):
        nums.append(f"replay gap {gap:.4f}")
    nums.append(f"{c.agree} tokens agree; {n_diffs} differing positions")
    return [what + ".", " · ".join(nums)], kind


def _diagnosis_line(trace: Trace, diagnosis_error: str | None, diag_note: str) -> str | None:
    """The diagnosis' line: its explanation, why there is none, or None."""
    diag = trace.diagnosis if isinstance(trace.diagnosis, dict) else None
    if diagnosis_error == DIAGNOSIS_CANCELLED:
        if trace.comparison.identical:
            return "<i>The diagnosis was cancelled by the user; the run above is complete.</i>"
        return ("<i>The diagnosis was cancelled by the user, so the fork is not classified (near-tie or bug).</i> "
                f"{try_link({}, 'Run again')} to diagnose it.")
    if diagnosis_error:
        return f"<i>diagnosis failed: {html.escape(diagnosis_error)}</i>"
    if diag:
        expl = diag.get("explanation")
        if isinstance(expl, str) and expl.strip():
            return f"<i>{html.escape(expl.strip())}</i>"
        if diag_note:
            return f"<i>diagnosis: {html.escape(diag_note)}</i>"
    return None


def trace_verdict(trace: Trace, *, cancelled: bool = False, diagnosis_error: str | None = None,
                  diag_note: str = "", n_diffs: int = 0, other_quants: list[str] | None = None,
                  kernel: Any = None) -> tuple[str, str]:
    """(rich text, kind) of a finished or opened trace; ``kernel``: the kernel map's prediction for its run.

    ``cancelled``: the user cancelled the arms.  ``diagnosis_error`` :data:`DIAGNOSIS_CANCELLED`: the user
    cancelled the diagnosis alone, after both arms had finished; the run is shown as it finished.
    """
    v, s, c = trace.vanilla, trace.speculative, trace.comparison
    fm = c.first_mismatch
    diag = trace.diagnosis if isinstance(trace.diagnosis, dict) else None
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
        lines, kind = _identical_head(trace, other_quants)
        parts.extend(lines)
    else:
        lines, kind = _fork_head(trace, diagnosis_verdict(diag), n_diffs)
        parts.extend(lines)
    if broken:
        kind = "bad"  # whatever the arms did, a backend that computes the model wrongly comes first
    # the head of an identical run that drafted nothing, or verified one row at a time, already says what the
    # diagnosis' explanation says of it
    said = not cancelled and c.identical and (drafted_nothing(trace) or single_row_verify(trace) is not None)
    line = _diagnosis_line(trace, diagnosis_error, diag_note)
    if line and not (said and not diagnosis_error):
        parts.append(line)
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
    blank = sum(1 for c in cells if cell_drafted_nothing(c))
    status = doc.get("status", "")
    head = {"interrupted": "Matrix cancelled", "running": "Matrix still running"}.get(status, "Matrix complete")
    nothing = f", {blank} drafted nothing (inconclusive)" if blank else ""
    text = f"<b>{head}</b>: {n} of {total} cells, {forks} forked, {errors} failed{nothing}."
    if n:
        text += "<br><i>Double-click a cell (or press Enter on it) to open it side by side.</i>"
    # a near-tie fork is expected numerics, not a bug: only a state bug, nondeterminism or an
    # undiagnosed fork colours the bar as a mismatch; a matrix none of whose cells drafted tested nothing
    if any(cell_category(c) in ("state", "nondeterministic", "diverged") for c in cells):
        return text, "bad"
    if forks or errors or status != "complete":
        return text, "warn"
    return text, "unsure" if blank and blank == n else "ok"


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
