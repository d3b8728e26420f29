"""Shareable bug reports: a self-contained HTML page and a GitHub-ready Markdown file.

This module is Qt-free: it turns a trace (or a matrix document) and already
rendered PNG plots into text.  The plots themselves are drawn by
:mod:`specview.report`, which owns the Qt side.

Token text is untrusted input: a token can be ``<script>``, a backtick fence,
a ``|`` or a newline.  Every piece of it goes through :func:`html.escape` in
HTML, and into Markdown only inside code spans or fenced blocks long enough
not to be closed by what they hold, or through :func:`md_text`.
"""

from __future__ import annotations

import base64
import html
import json
import re
from typing import Any, Mapping, Sequence

from .. import __version__
from .llama_flags import llama_commands, ngl_text  # noqa: F401  (the report's commands section)

CONTEXT_TOKENS = 8

VERDICT_COLOURS = {
    "identical": "#cfe8cf",
    "near-tie": "#f6e3a1",
    "state": "#f2a7a7",
    "nondeterministic": "#c9b6e8",
    "diverged": "#f3c89b",
    "error": "#d0d0d0",
    None: "#ffffff",
}
VERDICT_WORDS = {
    "identical": "identical",
    "near-tie": "near-tie flipped by batched-vs-single numerics",
    "state": "state bug (not a near-tie)",
    "nondeterministic": "nondeterministic (an arm does not reproduce itself)",
    "diverged": "diverged (not diagnosed)",
    "error": "error",
}


# ---------------------------------------------------------------------------
# escaping
# ---------------------------------------------------------------------------
def esc(text: Any) -> str:
    """HTML-escape anything, quotes included (safe in text and in attribute values)."""
    return html.escape("" if text is None else str(text), quote=True)


def visible(piece: str | None) -> str:
    """A token's text with its invisible characters made visible (newline ⏎, tab ⇥, CR ␍, NUL ␀)."""
    if piece is None:
        return "(end of output)"
    out = piece.replace("\r", "␍").replace("\n", "⏎").replace("\t", "⇥").replace("\x00", "␀")
    return "".join(ch if ch.isprintable() or ch == " " else f"\\x{ord(ch):02x}" for ch in out)


def _longest_run(text: str, ch: str) -> int:
    runs = re.findall(re.escape(ch) + "+", text)
    return max((len(r) for r in runs), default=0)


def md_code(text: Any, *, table: bool = False) -> str:
    """An inline Markdown code span that shows ``text`` literally, whatever it holds."""
    s = visible(str(text)) if text is not None else ""
    if table:
        s = s.replace("|", "\\|")  # GFM splits table cells on | even inside code spans
    if not s:
        return "` `"
    fence = "`" * (_longest_run(s, "`") + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(text: str, lang: str = "") -> str:
    """A fenced code block that ``text`` cannot close: the fence is longer than any backtick run in it."""
    n = max(3, _longest_run(text, "`") + 1)
    fence = "`" * n
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{lang}\n{body}{fence}\n"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~!])")
_MD_LINE_START = re.compile(r"^(\s*)(\d*)([#+\-=>.)])")


def md_text(text: Any) -> str:
    """Plain text escaped for Markdown prose and table cells (no markup, no HTML, one line).

    Characters that make markup anywhere are backslash-escaped; those that only do at the start of a
    line (headings, lists, quotes) are escaped there.
    """
    s = _MD_SPECIAL.sub(r"\\\1", visible(str(text)))
    m = _MD_LINE_START.match(s)
    if m and (m.group(2) == "") == (m.group(3) not in ".)"):  # "# x", "- x", "> x" or "1. x", "2) x"
        s = s[:m.start(3)] + "\\" + s[m.start(3):]
    return s


# ---------------------------------------------------------------------------
# facts shared by both formats
# ---------------------------------------------------------------------------
def verdict_of(trace: Any) -> str:
    if trace.comparison.identical:
        return "identical"
    d = trace.diagnosis or {}
    return str(d.get("verdict") or "diverged")


def headline(trace: Any) -> str:
    c = trace.comparison
    v = verdict_of(trace)
    if c.identical:
        return f"Identical: both arms produced the same {c.agree} tokens."
    fm = c.first_mismatch
    return (f"Speculative decoding diverges from plain greedy at token {fm.index} "
            f"(character {fm.char_offset}): {VERDICT_WORDS.get(v, v)}.")


def _fmt(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def verdict_facts(trace: Any) -> list[tuple[str, str]]:
    """(label, value) rows: the verdict and the numbers behind it."""
    c, v, s = trace.comparison, trace.vanilla, trace.speculative
    rows = [("verdict", VERDICT_WORDS.get(verdict_of(trace), verdict_of(trace)))]
    if c.identical:
        rows.append(("tokens compared", str(c.agree)))
    else:
        fm = c.first_mismatch
        rows.append(("first mismatch", f"token {fm.index} (character {fm.char_offset}); {c.agree} tokens agree"))
        rows.append(("vanilla token", f"{fm.vanilla_token} {visible(fm.vanilla_piece)!r}"))
        rows.append(("speculative token", f"{fm.speculative_token} {visible(fm.speculative_piece)!r}"))
        if fm.index < len(v.steps):
            rows.append(("vanilla top-1/top-2 margin at the fork", f"{v.steps[fm.index].margin:.4f} logits"))
        if fm.index < len(s.steps):
            st = s.steps[fm.index]
            kind = "an accepted draft token" if st.from_draft else "the target's own token"
            rows.append(("speculative token came from",
                         f"{kind}, round {st.round}, row {st.batch_index} of a T={st.batch_size} forward pass"))
    d = trace.diagnosis
    if d:
        if d.get("gap") is not None:
            rows.append(("gap (teacher-forced, one token per pass)", f"{d['gap']:.4f} logits for the vanilla token"))
        sp = ((d.get("replays") or {}).get("speculative") or {})
        if isinstance(sp.get("gap"), (int, float)):
            rows.append((f"gap in the speculative shape ({sp.get('shape', 'verify pass')})",
                         f"{sp['gap']:.4f} logits for the speculative token"))
        env = d.get("envelope") or {}
        if env.get("max") is not None:
            rows.append(("numeric envelope before the fork",
                         f"max {_fmt(env.get('max'))}, p95 {_fmt(env.get('p95'))}, median {_fmt(env.get('median'))} "
                         f"logits over {env.get('positions', '?')} positions"))
        th = d.get("thresholds") or {}
        if th.get("far") is not None:
            rows.append(("thresholds", f"near-tie ≤ {_fmt(th.get('near_tie'))}, state bug > {_fmt(th.get('far'))} logits"))
        if isinstance(d.get("at_risk"), list) and th.get("at_risk") is not None:
            rows.append((f"vanilla positions at risk (margin below {_fmt(th.get('at_risk'))})", str(len(d["at_risk"]))))
        if d.get("rule"):
            rows.append(("rule", str(d["rule"])))
    elif not c.identical:
        rows.append(("diagnosis", "not run (specview run --diagnose explains the fork)"))
    return rows


def acceptance_facts(trace: Any) -> list[tuple[str, str]]:
    v, s = trace.vanilla, trace.speculative
    rate, mean = s.acceptance_rate, s.mean_accepted
    speed = s.tokens_per_s / v.tokens_per_s if v.tokens_per_s > 0 else None
    return [
        ("drafter", str(trace.config.get("spec_type"))),
        ("verify rounds", str(max(0, len(s.rounds) - 1))),
        ("drafted / accepted", f"{s.n_drafted} / {s.n_accepted}"),
        ("acceptance rate", "n/a" if rate is None else f"{rate:.1%}"),
        ("mean tokens per round", "n/a" if mean is None else f"{mean:.2f}"),
        ("vanilla", f"{v.tokens_per_s:.1f} tok/s, {len(v.tokens)} tokens ({v.stop_reason})"),
        ("speculative", f"{s.tokens_per_s:.1f} tok/s, {len(s.tokens)} tokens ({s.stop_reason})"),
        ("speedup", "n/a" if speed is None else f"{speed:.2f}x"),
    ]


def config_facts(trace: Any) -> list[tuple[str, str]]:
    cfg = trace.config
    eng = cfg.get("engine") or {}
    rows = [
        ("spec type", str(cfg.get("spec_type"))),
        ("n_max / n_min / p_min", f"{cfg.get('n_max')} / {cfg.get('n_min')} / {cfg.get('p_min')}"),
        ("max tokens", str(cfg.get("max_tokens"))),
        ("context", f"{cfg.get('n_ctx_used', eng.get('n_ctx'))} (n_batch {eng.get('n_batch')}, "
                    f"n_ubatch {eng.get('n_ubatch')})"),
        ("flash attention", str(eng.get("flash_attn"))),
        ("KV cache type", str(eng.get("kv_type"))),
        ("GPU layers", ngl_text(eng.get("gpu_layers"))),
        ("threads", str(eng.get("threads") or "all cores")),
    ]
    if cfg.get("spec_type") == "ngram-simple":
        rows.insert(2, ("ngram size n / m", f"{cfg.get('ngram_size_n')} / {cfg.get('ngram_size_m')}"))
    return rows


def model_facts(trace: Any) -> list[tuple[str, str, str]]:
    """(fact, target, draft) rows."""
    t = trace.models.get("target") or {}
    d = trace.models.get("draft") or {}
    keys = [("file", "file"), ("quantization", "quantization"), ("architecture", "architecture"),
            ("name", "name"), ("parameters", "n_params"), ("file size", "file_size"), ("vocabulary", "n_vocab"),
            ("vocab fingerprint", "vocab_fingerprint"), ("description", "description")]
    rows = []
    for label, k in keys:
        a, b = t.get(k), d.get(k) if d else None
        if a is None and b is None:
            continue
        if k == "file_size":
            a = f"{a / 1e6:.1f} MB" if isinstance(a, (int, float)) else a
            b = f"{b / 1e6:.1f} MB" if isinstance(b, (int, float)) else b
        if k == "n_params":
            a = f"{a / 1e6:.1f} M" if isinstance(a, (int, float)) else a
            b = f"{b / 1e6:.1f} M" if isinstance(b, (int, float)) else b
        rows.append((label, "-" if a is None else str(a), "-" if b is None else str(b)))
    return rows


def environment_facts(env: Mapping[str, Any]) -> list[tuple[str, str]]:
    order = ["specview", "backend", "llama_cpp_python", "os", "platform", "machine", "cpu", "python",
             "gpu_offload", "ggml_devices", "llama_cpp_system_info", "created"]
    rows = []
    for k in order + sorted(set(env) - set(order)):
        if k in env and env[k] not in (None, "", []):
            v = env[k]
            if isinstance(v, (list, dict)):
                v = json.dumps(v, ensure_ascii=False)
            rows.append((k, str(v)))
    return rows


def fork_context(trace: Any, n: int = CONTEXT_TOKENS) -> dict[str, Any] | None:
    """Tokens around the fork: the shared tokens before it and each arm's fork token and what follows."""
    c = trace.comparison
    if c.identical or c.first_mismatch is None:
        return None
    i = c.first_mismatch.index
    v, s = trace.vanilla, trace.speculative
    before = [(st.token, st.piece) for st in v.steps[max(0, i - n):i]]

    def arm(a: Any) -> dict[str, Any]:
        at = (a.steps[i].token, a.steps[i].piece) if i < len(a.steps) else None
        after = [(st.token, st.piece) for st in a.steps[i + 1:i + 1 + n]]
        return {"at": at, "after": after}

    return {"index": i, "before": before, "truncated": i > n, "vanilla": arm(v), "speculative": arm(s)}


# ---------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------
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
"""


def _kv_html(rows: Sequence[tuple[str, str]]) -> str:
    return "<table class=kv>" + "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in rows) + "</table>"


def _tok_html(tok: tuple[int, str] | None, cls: str) -> str:
    if tok is None:
        return f"<span class='tok {cls}' title='no token'>(end of output)</span>"
    t, piece = tok
    return f"<span class='tok {cls}' title='{esc(f'token {t}')}'>{esc(visible(piece))}</span>"


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


PLOT_CAPTIONS = {
    "margins": ("Top-1/top-2 margin per token",
                "Top-1 minus top-2 logit of the row that chose each token, for both arms (log scale). "
                "The dashed red line marks the fork; the shaded band is the replay envelope, how far the "
                "batched and single-token shapes move the logits on the shared prefix."),
    "margins_zoom": ("Top-1/top-2 margin around the fork",
                     "The margin plot again, zoomed on the tokens just before and after the fork."),
    "acceptance": ("Acceptance per round",
                   "Tokens drafted (grey) and accepted (green) in each verify round; the red line marks the "
                   "round that produced the fork."),
}


def _prompt_block(trace: Any) -> tuple[str, str]:
    """(label, text) for the prompt: its text, or the raw token ids."""
    p = trace.prompt
    toks = p.get("tokens", [])
    if p.get("raw_tokens") or p.get("text") is None:
        return (f"raw token ids ({len(toks)} tokens, no template, no BOS added)", " ".join(str(t) for t in toks))
    how = "with the model's chat template" if p.get("chat") else "as plain text, no template"
    return (f"text, {how} ({len(toks)} tokens after tokenizing)", str(p.get("text")))


def trace_title(trace: Any) -> str:
    t = trace.models.get("target") or {}
    d = trace.models.get("draft") or {}
    drafter = trace.config.get("spec_type")
    if drafter == "draft-simple":
        drafter = f"{d.get('file', trace.config.get('draft'))} ({d.get('quantization', '?')})"
    return f"{t.get('file', trace.config.get('target'))} ({t.get('quantization', '?')}) with {drafter}"


def trace_html(trace: Any, plots: Mapping[str, bytes]) -> str:
    v = verdict_of(trace)
    parts = [f"<h1>specview report: {esc(trace_title(trace))}</h1>",
             f"<div class=sub>specview {esc(trace.environment.get('specview', __version__))} · "
             f"{esc(trace.environment.get('created', ''))} · greedy speculative decoding against plain greedy</div>",
             f"<div class=verdict style='background:{VERDICT_COLOURS.get(v, '#fff')}'><b>{esc(v.upper())}</b> — "
             f"{esc(headline(trace))}</div>"]
    d = trace.diagnosis
    if d and d.get("explanation"):
        parts.append(f"<p>{esc(d['explanation'])}</p>")
    parts.append(_kv_html(verdict_facts(trace)))
    ctx = fork_context(trace)
    if ctx is not None:
        parts.append(f"<h2>The fork, token {ctx['index']}</h2>")
        parts.append(_fork_html(ctx))
    for key in PLOT_CAPTIONS:
        if key in plots:
            title, cap = PLOT_CAPTIONS[key]
            parts.append(f"<h2>{esc(title)}</h2>")
            parts.append(_img_html(plots[key], title, cap))
    parts.append("<h2>Acceptance and speed</h2>")
    parts.append(_kv_html(acceptance_facts(trace)))
    cmds = llama_commands(trace.config, trace.models, trace.prompt)
    parts.append("<h2>Reproduce with llama.cpp</h2>")
    parts.append("<p class=note>Start both servers, send the same prompt token ids to each, compare the tokens. "
                 "The flags are llama.cpp's own (common/arg.cpp).</p>")
    parts.append(f"<pre>{esc(cmds['server_vanilla'])}\n\n{esc(cmds['server_speculative'])}</pre>")
    parts.append(f"<pre>{esc(cmds['request'])}</pre>")
    if "cli_vanilla" in cmds:
        parts.append("<p class=note>Or with the command-line tool (it applies the chat template itself):</p>")
        parts.append(f"<pre>{esc(cmds['cli_vanilla'])}\n\n{esc(cmds['cli_speculative'])}</pre>")
    label, text = _prompt_block(trace)
    parts.append("<h2>Prompt</h2>")
    parts.append(f"<p class=note>{esc(label)}</p><pre>{esc(text)}</pre>")
    parts.append("<h2>Settings</h2>")
    parts.append(_kv_html(config_facts(trace)))
    parts.append("<h2>Models</h2>")
    parts.append("<table class=kv><tr><th></th><th>target</th><th>draft</th></tr>" + "".join(
        f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>" for a, b, c in model_facts(trace))
        + "</table>")
    parts.append("<h2>Environment</h2>")
    parts.append(_kv_html(environment_facts(trace.environment)))
    parts.append("<h2>Both texts</h2>")
    for arm in (trace.vanilla, trace.speculative):
        parts.append(f"<p class=note>{esc(arm.name)} ({len(arm.tokens)} tokens)</p><pre>{esc(arm.text)}</pre>")
    return _page(f"specview: {v}", "\n".join(parts))


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------
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
    ids = [f"{arm}: token {ctx[arm]['at'][0]}" if ctx[arm]["at"] else f"{arm}: none" for arm in ("vanilla", "speculative")]
    return (md_fence("\n".join(lines)) + "\n⟦ ⟧ marks the first token the arms disagree on "
            f"({md_text('; '.join(ids))}); ⏎ is a newline.\n")


def trace_markdown(trace: Any, plot_files: Mapping[str, str]) -> str:
    v = verdict_of(trace)
    out = [f"## specview: {md_text(v)} — {md_text(trace_title(trace))}\n",
           f"**{md_text(headline(trace))}**\n"]
    d = trace.diagnosis
    if d and d.get("explanation"):
        out.append(md_text(d["explanation"]) + "\n")
    out.append(_kv_md(verdict_facts(trace)))
    ctx = fork_context(trace)
    if ctx is not None:
        out.append(f"### The fork, token {ctx['index']}\n")
        out.append(_fork_md(ctx))
    for key in PLOT_CAPTIONS:
        if key in plot_files:
            title, cap = PLOT_CAPTIONS[key]
            out.append(f"### {title}\n")
            out.append(f"![{title}]({plot_files[key]})\n\n{md_text(cap)}\n")
    out.append("### Acceptance and speed\n")
    out.append(_kv_md(acceptance_facts(trace)))
    cmds = llama_commands(trace.config, trace.models, trace.prompt)
    out.append("### Reproduce with llama.cpp\n")
    out.append("Start both servers, send the same prompt token ids to each, compare the tokens:\n")
    out.append(md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh"))
    out.append(md_fence(cmds["request"], "sh"))
    if "cli_vanilla" in cmds:
        out.append("Or with the command-line tool (it applies the chat template itself):\n")
        out.append(md_fence(cmds["cli_vanilla"] + "\n\n" + cmds["cli_speculative"], "sh"))
    label, text = _prompt_block(trace)
    out.append("### Prompt\n")
    out.append(md_text(label) + "\n")
    out.append(md_fence(text, "text"))
    out.append("<details><summary>Settings, models and environment</summary>\n")
    out.append(_kv_md(config_facts(trace), ("setting", "value")))
    mrows = model_facts(trace)
    out.append("| | target | draft |\n|---|---|---|\n" + "".join(
        f"| {md_text(a)} | {md_code(b, table=True)} | {md_code(c, table=True)} |\n" for a, b, c in mrows))
    out.append(_kv_md(environment_facts(trace.environment), ("environment", "")))
    out.append("</details>\n")
    out.append(f"<sub>Made with specview {md_text(trace.environment.get('specview', __version__))}.</sub>\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# matrix reports
# ---------------------------------------------------------------------------
def _quoted(piece: str | None) -> str:
    return "(end of output)" if piece is None else f"'{visible(piece)}'"


def _cell_short(cell: dict[str, Any] | None) -> str:
    from .matrix import verdict_label

    if cell is None:
        return "not run"
    if cell.get("status") == "error":
        return "error"
    if cell.get("identical"):
        return "identical"
    v = verdict_label(cell)
    return f"fork @ {cell.get('first_mismatch')} · {'diverged' if v.startswith('diverged') else v}"


def _cell_colour(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "#ffffff"
    if cell.get("status") == "error":
        return VERDICT_COLOURS["error"]
    return VERDICT_COLOURS.get(cell.get("verdict"), VERDICT_COLOURS["diverged"])


def _cell_detail(cell: dict[str, Any]) -> str:
    bits = []
    if cell.get("acceptance_rate") is not None:
        bits.append(f"acc {cell['acceptance_rate']:.0%}")
    if cell.get("speedup") is not None:
        bits.append(f"{cell['speedup']:.2f}x")
    return " · ".join(bits)


def earliest_fork(doc: dict[str, Any]) -> dict[str, Any] | None:
    forks = [c for c in doc.get("cells", []) if c.get("status") == "ok" and not c.get("identical")
             and c.get("first_mismatch") is not None]
    return min(forks, key=lambda c: c["first_mismatch"]) if forks else None


def _repro_html(trace: Any, cell: dict[str, Any]) -> str:
    from .matrix import CellParams, describe

    cmds = llama_commands(trace.config, trace.models, trace.prompt)
    return (f"<h2>Reproduce the earliest fork</h2><p class=note>{esc(describe(CellParams.from_json(cell['params'])))}: "
            f"token {esc(cell['first_mismatch'])}, from its saved trace {esc(cell.get('trace'))} "
            "(<code>specview report</code> on that file gives its full report).</p>"
            f"<pre>{esc(cmds['server_vanilla'])}\n\n{esc(cmds['server_speculative'])}</pre>"
            f"<pre>{esc(cmds['request'])}</pre>")


def _repro_md(trace: Any, cell: dict[str, Any]) -> str:
    from .matrix import CellParams, describe

    cmds = llama_commands(trace.config, trace.models, trace.prompt)
    return ("### Reproduce the earliest fork\n\n"
            f"{md_text(describe(CellParams.from_json(cell['params'])))}: token {cell['first_mismatch']}, from its saved "
            f"trace {md_code(cell.get('trace'))} (`specview report` on that file gives its full report).\n\n"
            + md_fence(cmds["server_vanilla"] + "\n\n" + cmds["server_speculative"], "sh") + "\n"
            + md_fence(cmds["request"], "sh"))


def matrix_html(doc: dict[str, Any], fork_trace: Any = None) -> str:
    from .matrix import describe, grid, summarize, CellParams

    g = grid(doc)
    cells = doc.get("cells", [])
    spec = doc.get("spec", {})
    parts = [f"<h1>specview matrix: {len(cells)} cells</h1>",
             f"<div class=sub>specview {esc(doc.get('specview', ''))} · {esc(doc.get('created', ''))} · "
             f"status {esc(doc.get('status'))} · {esc(spec.get('max_tokens'))} tokens per arm</div>",
             "<h2>What it shows</h2><ul class=summary>"
             + "".join(f"<li>{esc(s)}</li>" for s in summarize(doc)) + "</ul>",
             "<h2>Grid</h2>",
             "<div class=legend>" + "".join(
                 f"<span style='background:{VERDICT_COLOURS[k]}'>{esc(k if k != 'diverged' else 'diverged (not diagnosed)')}</span>"
                 for k in ("identical", "near-tie", "state", "nondeterministic", "diverged", "error")) + "</div>"]
    head = "<tr><th>" + esc(" · ".join(g.row_axes)) + "</th>" + "".join(
        f"<th>{esc(g.col_label(c))}</th>" for c in g.cols) + "</tr>"
    body = []
    for r in g.rows:
        tds = []
        for c in g.cols:
            cell = g.at.get((r, c))
            detail = _cell_detail(cell) if cell and cell.get("status") == "ok" else (
                cell.get("error", "") if cell else "")
            tds.append(f"<td style='background:{_cell_colour(cell)}' title='{esc(detail)}'>{esc(_cell_short(cell))}"
                       + (f"<br><small>{esc(detail)}</small>" if detail and cell and cell.get('status') == 'ok' else "")
                       + "</td>")
        body.append(f"<tr><td class=row>{esc(g.row_label(r))}</td>{''.join(tds)}</tr>")
    parts.append(f"<table class=grid>{head}{''.join(body)}</table>")
    forks = [c for c in cells if c.get("status") == "ok" and not c.get("identical")]
    if forks:
        parts.append("<h2>Forks</h2><table class=kv><tr><th>cell</th><th>token</th><th>vanilla</th>"
                     "<th>speculative</th><th>verdict</th><th>gap</th><th>trace</th></tr>")
        for c in forks:
            f = c.get("fork") or {}
            parts.append(
                f"<tr><td>{esc(describe(CellParams.from_json(c['params'])))}</td><td>{esc(c.get('first_mismatch'))}</td>"
                f"<td><code>{esc(_quoted(f.get('vanilla_piece')))}</code></td>"
                f"<td><code>{esc(_quoted(f.get('speculative_piece')))}</code></td>"
                f"<td>{esc(_cell_short(c).split(' · ')[-1])}</td><td>{esc(_fmt(c.get('gap')))}</td>"
                f"<td>{esc(c.get('trace') or '')}</td></tr>")
        parts.append("</table>")
    errs = [c for c in cells if c.get("status") == "error"]
    if errs:
        parts.append("<h2>Failed cells</h2><ul>" + "".join(
            f"<li>{esc(describe(CellParams.from_json(c['params'])))}: {esc(c.get('error'))}</li>" for c in errs) + "</ul>")
    cell = earliest_fork(doc)
    if fork_trace is not None and cell is not None:
        parts.append(_repro_html(fork_trace, cell))
    parts.append("<h2>Axes</h2>")
    parts.append(_kv_html(_spec_rows(spec)))
    ctr = doc.get("counters") or {}
    parts.append(f"<p class=note>{esc(ctr.get('loads'))} model loads, {esc(ctr.get('vanilla_runs'))} vanilla runs, "
                 f"{esc(ctr.get('speculative_runs'))} speculative runs, {esc(doc.get('elapsed_s'))} s.</p>")
    parts.append("<h2>Environment</h2>")
    parts.append(_kv_html(environment_facts(doc.get("environment") or {})))
    return _page("specview matrix", "\n".join(parts))


def _spec_rows(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    from .matrix import model_label

    prompts = []
    for p in spec.get("prompts", []):
        if p.get("tokens") is not None:
            prompts.append(f"{p['name']} ({len(p['tokens'])} raw tokens)")
        else:
            prompts.append(f"{p['name']}")
    eng = spec.get("engine") or {}
    return [
        ("targets", ", ".join(model_label(t) for t in spec.get("targets", []))),
        ("drafters", ", ".join(model_label(t) for t in spec.get("drafters", []))),
        ("n_max", ", ".join(str(x) for x in spec.get("n_max", []))),
        ("p_min", ", ".join(f"{x:g}" for x in spec.get("p_min", []))),
        ("flash attention", ", ".join(spec.get("flash_attn", []))),
        ("prompts", ", ".join(prompts)),
        ("max tokens", str(spec.get("max_tokens"))),
        ("engine", ", ".join(f"{k}={v}" for k, v in eng.items() if k != "flash_attn")),
    ]


def matrix_markdown(doc: dict[str, Any], fork_trace: Any = None) -> str:
    from .matrix import CellParams, describe, grid, summarize

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
            txt = md_text(_cell_short(cell))
            vals.append(f"**{txt}**" if cell and cell.get("status") == "ok" and not cell.get("identical") else txt)
        rows.append(f"| {md_text(g.row_label(r))} | " + " | ".join(vals) + " |")
    out.append("\n".join([head, sep, *rows]) + "\n")
    forks = [c for c in cells if c.get("status") == "ok" and not c.get("identical")]
    if forks:
        out.append("### Forks\n")
        out.append("| cell | token | vanilla | speculative | verdict | gap |\n|---|---|---|---|---|---|")
        for c in forks:
            f = c.get("fork") or {}
            out.append(f"| {md_text(describe(CellParams.from_json(c['params'])))} | {c.get('first_mismatch')} | "
                       f"{md_code(_quoted(f.get('vanilla_piece')), table=True)} | "
                       f"{md_code(_quoted(f.get('speculative_piece')), table=True)} | "
                       f"{md_text(_cell_short(c).split(' · ')[-1])} | {md_text(_fmt(c.get('gap')))} |")
        out.append("")
    cell = earliest_fork(doc)
    if fork_trace is not None and cell is not None:
        out.append(_repro_md(fork_trace, cell))
    out.append("<details><summary>Axes and environment</summary>\n")
    out.append(_kv_md(_spec_rows(doc.get("spec", {})), ("axis", "values")))
    out.append(_kv_md(environment_facts(doc.get("environment") or {}), ("environment", "")))
    out.append("</details>\n")
    return "\n".join(out)
