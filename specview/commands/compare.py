"""``specview compare A.json B.json``: two saved traces of the same prompt and model, e.g. from two machines.

For each arm it says whether A and B produced the same tokens and, if not,
where they first differ, with the tokens and text around it; and it lists what
differs between the runs (models, settings, environment) so the cause can be
narrowed down.  Traces of different prompts (or vocabularies) are refused.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.arms.compare import first_difference
from ..core.engine import SpecviewError
from ..core.report.escape import num, text, visible
from ..core.trace import ArmResult, Trace, short

EXIT_SAME, EXIT_DIFFERENT = 0, 1
CONTEXT = 8


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="compare two saved traces (e.g. from two machines)",
        description="Compare two traces of the same prompt and model made on different machines, builds or "
        "backends: per arm (vanilla, speculative) the first token where A and B differ, with both texts around "
        "it; whether the models and settings match; and what differs in the environment. Traces of different "
        "prompts are refused. Given a folder instead, gathers the summary of every trace and fork card in it into one "
        "table (printed) and one self-contained HTML page: what is the same on every machine (models, settings, "
        "acceptance where it agrees) apart from what is not (machine, backend, build, exactness, speed); a card whose "
        "checksum no longer matches its content is marked EDITED.",
        epilog="Exit status: 0 both arms produced the same tokens in A and B (a folder: on every machine, and no card "
        "edited), 1 they differ (or a card is edited), 2 error (unreadable file, different prompts or vocabularies).",
    )
    p.add_argument("a", metavar="A.json|DIR", help="a trace saved by specview run --json or the app; or a folder of "
                   "traces and fork cards from many machines, gathered into one table")
    p.add_argument("b", metavar="B.json", nargs="?", default=None, help="another trace of the same prompt and model")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="with a folder: the cross-machine page to write (default DIR/compare.html)")
    p.add_argument("--context", type=int, default=CONTEXT, help=f"tokens of context around a difference (default {CONTEXT})")
    p.set_defaults(func=main)
    return p


def _arm_diff(a: ArmResult, b: ArmResult) -> dict[str, Any]:
    """Where two runs of the same arm first differ.  A run cut short by max_tokens is compared on its length."""
    ta, tb = a.tokens, b.tokens
    n = None
    if len(ta) != len(tb):
        short = a if len(ta) < len(tb) else b
        if short.stop_reason == "max_tokens":
            n = min(len(ta), len(tb))
    i = first_difference(ta[:n] if n else ta, tb[:n] if n else tb)
    out: dict[str, Any] = {"same": i is None, "index": i, "compared": n or max(len(ta), len(tb)),
                           "n_a": len(ta), "n_b": len(tb)}
    if i is not None:
        out["a_token"] = ta[i] if i < len(ta) else None
        out["b_token"] = tb[i] if i < len(tb) else None
        out["a_piece"] = a.steps[i].piece if i < len(a.steps) else None
        out["b_piece"] = b.steps[i].piece if i < len(b.steps) else None
        out["a_margin"] = a.steps[i].margin if i < len(a.steps) else None
        out["b_margin"] = b.steps[i].margin if i < len(b.steps) else None
    return out


def _model_rows(a: Trace, b: Trace) -> list[tuple[str, str, str, bool]]:
    rows = []
    for role in ("target", "draft"):
        ma, mb = _obj(a.models.get(role)), _obj(b.models.get(role))
        if not ma and not mb:
            continue
        for key in ("file", "quantization", "file_size", "n_params", "vocab_fingerprint"):
            va, vb = ma.get(key), mb.get(key)
            if va is None and vb is None:
                continue
            rows.append((f"{role} {key}", text(va), text(vb), va == vb))
    return rows


def _flatten(d: Any, max_depth: int = 8) -> dict[str, Any]:
    """``{"engine": {"n_batch": 512}}`` -> ``{"engine.n_batch": 512}``; deeper levels are compared as they are."""
    out: dict[str, Any] = {}
    stack = [("", d if isinstance(d, dict) else {}, 0)]
    while stack:
        prefix, obj, depth = stack.pop()
        for k, v in obj.items():
            if isinstance(v, dict) and depth < max_depth:
                stack.append((f"{prefix}{k}.", v, depth + 1))
            else:
                out[f"{prefix}{k}"] = v
    return out


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


SKIP_CONFIG = {"prompt", "prompt_tokens", "target", "draft", "top_k"}
SKIP_ENV = {"created"}


def _prompt_tokens(t: Trace, name: str) -> list[int]:
    toks = t.prompt.get("tokens") if isinstance(t.prompt, dict) else None
    if not isinstance(toks, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in toks):
        raise SpecviewError(f"{name}: malformed specview trace: prompt.tokens must be a list of token ids")
    return toks


def compare_traces(a: Trace, b: Trace, *, names: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """Compare two traces; raise SpecviewError if they are not runs of the same prompt."""
    pa, pb = _prompt_tokens(a, names[0]), _prompt_tokens(b, names[1])
    if pa != pb:
        i = first_difference(pa, pb)
        raise SpecviewError(
            f"the traces are runs of different prompts ({names[0]}: {len(pa)} prompt tokens, {names[1]}: {len(pb)}; "
            f"first difference at prompt token {i}); compare traces of the same prompt and model")
    fa = _obj(a.models.get("target")).get("vocab_fingerprint")
    fb = _obj(b.models.get("target")).get("vocab_fingerprint")
    if fa and fb and fa != fb:
        raise SpecviewError(f"{names[0]} and {names[1]}: the targets have different vocabularies (fingerprints "
                            f"{short(fa)} and {short(fb)}): token ids cannot be compared")
    ca = {k: v for k, v in _flatten(a.config).items() if k not in SKIP_CONFIG}
    cb = {k: v for k, v in _flatten(b.config).items() if k not in SKIP_CONFIG}
    ea = {k: v for k, v in _flatten(a.environment).items() if k not in SKIP_ENV}
    eb = {k: v for k, v in _flatten(b.environment).items() if k not in SKIP_ENV}
    return {
        "prompt_tokens": len(pa),
        "vanilla": _arm_diff(a.vanilla, b.vanilla),
        "speculative": _arm_diff(a.speculative, b.speculative),
        "models": _model_rows(a, b),
        "config": [(k, ca.get(k), cb.get(k)) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)],
        "environment": [(k, ea.get(k), eb.get(k)) for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)],
        "verdicts": (_own(a), _own(b)),
    }


def _own(t: Trace) -> str:
    c = t.comparison
    if c.identical:
        return f"identical over {text(c.agree)} tokens"
    v = _obj(t.diagnosis).get("verdict") or "not diagnosed"
    return f"forks at token {text(c.first_mismatch.index)} ({text(v)})"


def _ctx(arm: ArmResult, i: int, n: int) -> str:
    # visible(): a terminal is shown a token's escape sequences and control characters, never given them
    before = "".join(visible(s.piece) for s in arm.steps[max(0, i - n):i])
    at = visible(arm.steps[i].piece) if i < len(arm.steps) else "(end of output)"
    after = "".join(visible(s.piece) for s in arm.steps[i + 1:i + 1 + n])
    return f"…{before}[[{at}]]{after}…"


def _short(v: Any, width: int = 60) -> str:
    s = visible(text(v))
    return s if len(s) <= width else s[: width - 1] + "…"


def format_comparison(res: dict[str, Any], a: Trace, b: Trace, names: tuple[str, str], context: int = CONTEXT) -> str:
    na, nb = names
    lines = [f"A  {na}", f"B  {nb}", f"prompt: the same {res['prompt_tokens']} tokens in both", ""]
    for arm_name in ("vanilla", "speculative"):
        d = res[arm_name]
        arm_a, arm_b = getattr(a, arm_name), getattr(b, arm_name)
        if d["same"]:
            extra = "" if d["n_a"] == d["n_b"] else f" (lengths {d['n_a']} and {d['n_b']}; compared the first {d['compared']})"
            lines.append(f"{arm_name:<12} SAME: A and B produced the same {d['compared']} tokens{extra}")
        else:
            i = d["index"]
            lines.append(f"{arm_name:<12} DIFFERENT from token {i}: A {text(d['a_token'])} {text(d['a_piece'])!r}, "
                         f"B {text(d['b_token'])} {text(d['b_piece'])!r}")
            if d.get("a_margin") is not None and d.get("b_margin") is not None:
                lines.append(f"{'':<12} top-1/top-2 margin there: A {num(d['a_margin'])}, B {num(d['b_margin'])} logits")
            lines.append(f"{'':<12} A  {_ctx(arm_a, i, context)}")
            lines.append(f"{'':<12} B  {_ctx(arm_b, i, context)}")
    lines.append("")
    lines.append(f"each trace on its own: A {res['verdicts'][0]}; B {res['verdicts'][1]}")
    lines.append("")
    diff_models = [r for r in res["models"] if not r[3]]
    if diff_models:
        lines.append("models differ:")
        lines += [f"  {k:<26} A {_short(x)}  |  B {_short(y)}" for k, x, y, _ in diff_models]
    else:
        lines.append("models: the same (file, quantization, size, vocabulary)")
    if res["config"]:
        lines.append("settings differ:")
        lines += [f"  {k:<26} A {_short(x)}  |  B {_short(y)}" for k, x, y in res["config"]]
    else:
        lines.append("settings: the same")
    if res["environment"]:
        lines.append("environment differs:")
        lines += [f"  {k:<26} A {_short(x)}  |  B {_short(y)}" for k, x, y in res["environment"]]
    else:
        lines.append("environment: the same")
    return "\n".join(lines)


def across_machines(folder: str, out: str | None) -> int:
    from pathlib import Path

    from ..core.report.crossmachine import cross_html, cross_table, format_table, gather
    from ..core.trace import write_atomic

    cards, skipped = gather(folder)
    table = cross_table(cards)
    print(format_table(table, skipped))
    page = Path(out) if out else Path(folder) / "compare.html"
    try:
        write_atomic(page, cross_html(table, skipped))
    except SpecviewError as exc:
        raise SpecviewError(f"--html {page}: {exc}") from None
    print(f"html       {page}")
    edited = any(c.status == "edited" for c in cards)
    return EXIT_SAME if table.exact_everywhere and not edited else EXIT_DIFFERENT


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    if Path(args.a).is_dir():
        if args.b is not None:
            raise SpecviewError(f"{args.a} is a folder: give the folder alone (one table across machines), or two traces")
        return across_machines(args.a, args.html)
    if args.b is None:
        raise SpecviewError(f"{args.a}: give two traces to compare (A.json B.json), or a folder of them")
    if args.html is not None:
        raise SpecviewError("--html: only a folder of traces and fork cards gets a page; give a folder")
    a, b = Trace.load(args.a), Trace.load(args.b)
    res = compare_traces(a, b, names=(args.a, args.b))
    print(format_comparison(res, a, b, (args.a, args.b), args.context))
    return EXIT_SAME if res["vanilla"]["same"] and res["speculative"]["same"] else EXIT_DIFFERENT
