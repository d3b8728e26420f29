"""One self-contained HTML file of a run: the arms side by side and linked, the plots as inline SVG, the verdict
and the fork card; a file to attach to an issue.

No server, no network, nothing external: the page's Content-Security-Policy
allows no fetch of any kind (``default-src 'none'``), only its own inline style
and script.  Every token's text is escaped into the page; the script reads the
per-token facts from a JSON block in which ``<`` is written as ``\\u003c``, so
no token can close it.  Hovering or clicking a token (in either arm, or on a
plot) selects that index everywhere: both arms' tokens, a cursor on every plot,
and the facts of both rows; the arrow keys step through the tokens.
"""

from __future__ import annotations

import json
from typing import Any

from ... import __version__
from ..diagnose.ties import tie_density
from ..diagnose.tracks import acceptance_histogram, pair_tracks
from ..verdicts import COLOURS, WORDS
from .escape import esc, visible
from .facts import headline, obj, trace_title, verdict_of
from .html import CSS, HtmlWriter
from .outline import trace_sections
from .svgplots import acceptance_svg, lengths_svg, margin_svg, track_svg

LINKED_CSS = """
.arms{display:grid;grid-template-columns:1fr 1fr;gap:14px}
.arm{border:1px solid #ddd;border-radius:5px;padding:8px 10px;max-height:340px;overflow:auto;background:#fff}
.arm h3{margin:0 0 6px;font-size:14px}
.arm .tk{font-family:'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:13px;white-space:pre-wrap;cursor:pointer;
border-right:1px solid rgba(0,0,0,.09)}
.tk.after{color:#888}.tk.fork{background:#f3a0a0;font-weight:bold}.tk.draft{text-decoration:underline dotted #2e9e4f}
.tk.sel{outline:2px solid #1f6fb4;background:#d8e8fb}
.detail{font-size:13px;margin:8px 0;min-height:3.2em;background:#f6f8fa;border:1px solid #e1e4e8;border-radius:5px;
padding:6px 10px}
.card{border:2px solid #c0143c;border-radius:7px;padding:10px 14px;margin:12px 0;background:#fff7f8}
.card h2{border:0;margin:0 0 6px;padding:0}
.card table td{padding:2px 12px 2px 0;font-size:13.5px;vertical-align:top}.card td:first-child{color:#555}
svg.plot{max-width:100%;height:auto;display:block;margin:4px 0}
svg .tick{font-size:10px;fill:#555}svg .axl{font-size:11px;fill:#333}
svg .hit{fill:transparent;cursor:pointer}svg .cursor{stroke:#1f6fb4;stroke-width:1.5}
.pair{display:flex;gap:16px;flex-wrap:wrap}
"""

SCRIPT = r"""
(function () {
  var data = JSON.parse(document.getElementById('sv-data').textContent);
  var detail = document.getElementById('detail');
  var current = null;
  function fmt(x) { return x === null || x === undefined ? 'n/a' : (typeof x === 'number' ? x.toFixed(4) : String(x)); }
  function row(arm, i) {
    var s = data[arm][i];
    if (!s) { return arm + ': no token ' + i; }
    var out = arm + ': ' + JSON.stringify(s.piece) + ' (id ' + s.id + '), margin ' + fmt(s.margin) + ' logits';
    if (arm === 'speculative' && s.round !== null) {
      out += ', round ' + s.round + (s.draft ? ', accepted draft' : ", target's own") + ', row ' + s.row +
             ' of a T=' + s.T + ' pass';
    }
    return out;
  }
  function select(i, scroll) {
    if (!(i >= 0) || i >= data.n) { return; }
    current = i;
    document.querySelectorAll('.tk.sel').forEach(function (e) { e.classList.remove('sel'); });
    document.querySelectorAll('.tk[data-i="' + i + '"]').forEach(function (e) {
      e.classList.add('sel');
      if (scroll) { e.scrollIntoView({block: 'nearest'}); }
    });
    document.querySelectorAll('svg.plot').forEach(function (svg) {
      var hit = svg.querySelector('.hit[data-i="' + i + '"]');
      var cur = svg.querySelector('.cursor');
      if (!hit || !cur) { return; }
      var x = parseFloat(hit.getAttribute('x')) + parseFloat(hit.getAttribute('width')) / 2;
      cur.setAttribute('x1', x); cur.setAttribute('x2', x); cur.setAttribute('visibility', 'visible');
    });
    var t = data.tracks[i];
    var lines = ['token ' + i + (i === data.fork ? ' (the fork)' : (data.fork !== null && i > data.fork ?
                 ' (after the fork: the arms saw different texts)' : '')),
                 row('vanilla', i), row('speculative', i)];
    if (t) { lines.push('Δ-margin ' + fmt(t[0]) + ' logits, KL ' + fmt(t[1]) + ' nats'); }
    detail.textContent = lines.join('\n');
    detail.setAttribute('data-selected', String(i));
  }
  document.addEventListener('mouseover', function (ev) {
    var el = ev.target.closest ? ev.target.closest('[data-i]') : null;
    if (el) { select(parseInt(el.getAttribute('data-i'), 10), false); }
  });
  document.addEventListener('click', function (ev) {
    var el = ev.target.closest ? ev.target.closest('[data-i]') : null;
    if (el) { select(parseInt(el.getAttribute('data-i'), 10), true); }
  });
  document.addEventListener('keydown', function (ev) {
    if (current === null) { return; }
    if (ev.key === 'ArrowRight') { select(current + 1, true); }
    if (ev.key === 'ArrowLeft') { select(current - 1, true); }
  });
  window.specviewSelect = select;
  select(data.fork !== null ? data.fork : 0, true);
})();
"""


def _arm_html(arm: Any, fork: int | None) -> str:
    spans = []
    for st in arm.steps:
        cls = ["tk"]
        if fork is not None:
            cls.append("fork" if st.index == fork else "after" if st.index > fork else "shared")
        if st.from_draft:
            cls.append("draft")
        spans.append(f"<span class='{' '.join(cls)}' data-i='{st.index}' title='token {esc(st.token)}'>"
                     f"{esc(visible(st.piece))}</span>")
    label = "vanilla (one token per pass)" if arm.name == "vanilla" else "speculative (underlined: accepted drafts)"
    return (f"<div class=arm id='arm-{esc(arm.name)}'><h3>{esc(label)}, {len(arm.tokens)} tokens</h3>"
            + "".join(spans) + "</div>")


def _card_html(trace: Any, ties: dict[str, Any]) -> str:
    """The fork card: where the arms part, the two tokens, the margin, the gap, the verdict and why."""
    c, d = trace.comparison, obj(trace.diagnosis)
    v = verdict_of(trace)
    rows: list[tuple[str, str]] = [("verdict", f"{WORDS.get(v, v)}" + (f" (rule {d['rule']})" if d.get("rule") else ""))]
    fm = c.first_mismatch
    if fm is not None and fm.vanilla_token is not None and fm.speculative_token is not None:
        i = fm.index
        vs, ss = trace.vanilla.steps[i], trace.speculative.steps[i]
        rows += [("token", f"{i} (character {fm.char_offset}); the arms agree on the first {c.agree} tokens"),
                 ("vanilla", f"{fm.vanilla_token} {visible(fm.vanilla_piece)!r}, margin "
                             f"{'n/a' if vs.margin is None else f'{vs.margin:.4f}'} logits over its runner-up"),
                 ("speculative", f"{fm.speculative_token} {visible(fm.speculative_piece)!r}, "
                  + ("not reported" if ss.round is None else
                     f"{'an accepted draft' if ss.from_draft else 'the target’s own token'}, round {ss.round}, "
                     f"row {ss.batch_index} of a T={ss.batch_size} pass"))]
    elif c.identical:
        rows.append(("tokens", f"both arms produced the same {c.agree} tokens"))
    if isinstance(d.get("gap"), (int, float)):
        rows.append(("gap (teacher-forced)", f"{d['gap']:.4f} logits"))
    env = obj(d.get("envelope"))
    if isinstance(env.get("max"), (int, float)):
        rows.append(("envelope before the fork", f"max {env['max']:.4g} logits over {env.get('positions')} positions"))
    cal = next((b for b in ties["bands"] if b.get("calibrated")), None)
    band = ties["bands"][0] if cal is None else cal
    rows.append(("near-tie density", f"{band['in_band']} of {ties['positions']} compared positions in the "
                                     f"{'calibrated' if cal else band['name']} band, {band['flipped']} flipped"))
    sv = obj(d.get("serial_verify"))
    if "identical_to_vanilla" in sv:
        rows.append(("serial-verify control", "reproduces vanilla" if sv["identical_to_vanilla"] else
                     "does NOT reproduce vanilla"))
    title = f"Fork card: token {fm.index}" if fm is not None else "Run card"
    return (f"<div class=card id=fork-card style='border-color:{COLOURS.get(v, '#888')}'><h2>{esc(title)}</h2>"
            "<table>" + "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in rows)
            + "</table></div>")


def _data_json(trace: Any, tracks: dict[str, list]) -> str:
    def steps(arm: Any) -> list[dict[str, Any]]:
        return [{"id": st.token, "piece": st.piece, "margin": _finite(st.margin), "round": st.round,
                 "draft": bool(st.from_draft), "row": st.batch_index, "T": st.batch_size} for st in arm.steps]

    fm = trace.comparison.first_mismatch
    d = {"n": max(len(trace.vanilla.steps), len(trace.speculative.steps)),
         "fork": None if fm is None else fm.index,
         "vanilla": steps(trace.vanilla), "speculative": steps(trace.speculative),
         "tracks": [list(p) for p in zip(tracks["delta_margin"], tracks["kl"])]}
    # "<" as an escape: no token's text can close the script element or open a comment in it
    return json.dumps(d, ensure_ascii=True, allow_nan=False, default=str).replace("<", "\\u003c")


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf") \
        else None


def linked_html(trace: Any, kernel: Any = None) -> str:
    """The self-contained, linked page of one run (a string of HTML)."""
    v = verdict_of(trace)
    env = obj(trace.environment)
    fm = trace.comparison.first_mismatch
    fork = None if fm is None or fm.vanilla_token is None or fm.speculative_token is None else fm.index
    ties = tie_density(trace)
    tracks = pair_tracks(trace)
    d = obj(trace.diagnosis)
    series = obj(d.get("envelope")).get("series")
    envelope = [_finite(x) for x in series] if isinstance(series, list) else []
    cal = next((b["width"] for b in ties["bands"] if b.get("calibrated")), None)
    n = max(len(trace.vanilla.steps), len(trace.speculative.steps))
    hist = acceptance_histogram(trace.speculative)
    parts = [f"<h1>specview: {esc(trace_title(trace))}</h1>",
             f"<div class=sub>specview {esc(env.get('specview', __version__))} · {esc(env.get('created', ''))} · "
             "greedy speculative decoding against plain greedy · hover or click a token</div>",
             f"<div class=verdict id=verdict style='background:{COLOURS.get(v, '#fff')}'><b>{esc(v.upper())}</b> — "
             f"{esc(headline(trace))}</div>",
             _card_html(trace, ties),
             "<h2>Both arms, token by token</h2>",
             f"<div class=arms>{_arm_html(trace.vanilla, fork)}{_arm_html(trace.speculative, fork)}</div>",
             "<pre class=detail id=detail aria-live=polite></pre>",
             "<h2>Top-1/top-2 margin per token</h2>",
             margin_svg([_finite(s.margin) for s in trace.vanilla.steps],
                        [_finite(s.margin) for s in trace.speculative.steps], fork=fork, envelope=envelope, band=cal),
             "<p class=note>Log scale, both arms; the dashed red line is the fork, the shaded band the replay "
             "envelope, the dashed purple line the calibrated tie band. Below, on the same tokens up to the fork: "
             "how far the speculative row moved vanilla's own top-1/top-2 margin (Δ-margin; the arms flip where it "
             "is below minus the margin), and the KL divergence of the two rows over the candidates both recorded.</p>",
             track_svg(tracks["delta_margin"], tracks["kl"], n, fork=fork),
             "<h2>Acceptance by position in the draft</h2>",
             f"<div class=pair>{acceptance_svg(hist)}{lengths_svg(hist)}</div>"]
    sections = [s for s in trace_sections(trace, (), kernel) if s.kind != "fork"]
    parts += HtmlWriter({}).draw(sections)
    body = "\n".join(parts)
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'\">"
            f"<title>{esc('specview: ' + v)}</title><style>{CSS}{LINKED_CSS}</style></head><body><main>\n{body}\n"
            f"<script type='application/json' id=sv-data>{_data_json(trace, tracks)}</script>"
            f"<script>{SCRIPT}</script></main></body></html>\n")


__all__ = ["linked_html"]
