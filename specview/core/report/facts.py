"""The facts a report states, as (label, value) rows shared by the HTML and the Markdown report."""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..llama_flags import ngl_text
from ..verdicts import COLOURS, WORDS, category
from .escape import visible

CONTEXT_TOKENS = 8


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
            f"(character {fm.char_offset}): {WORDS.get(v, v)}.")


def fmt(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def verdict_facts(trace: Any) -> list[tuple[str, str]]:
    """(label, value) rows: the verdict and the numbers behind it."""
    c, v, s = trace.comparison, trace.vanilla, trace.speculative
    rows = [("verdict", WORDS.get(verdict_of(trace), verdict_of(trace)))]
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
                         f"max {fmt(env.get('max'))}, p95 {fmt(env.get('p95'))}, median {fmt(env.get('median'))} "
                         f"logits over {env.get('positions', '?')} positions"))
        th = d.get("thresholds") or {}
        if th.get("far") is not None:
            rows.append(("thresholds", f"near-tie ≤ {fmt(th.get('near_tie'))}, state bug > {fmt(th.get('far'))} logits"))
        if isinstance(d.get("at_risk"), list) and th.get("at_risk") is not None:
            rows.append((f"vanilla positions at risk (margin below {fmt(th.get('at_risk'))})", str(len(d["at_risk"]))))
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


def prompt_block(trace: Any) -> tuple[str, str]:
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


def quoted(piece: str | None) -> str:
    return "(end of output)" if piece is None else f"'{visible(piece)}'"


def cell_colour(cell: dict[str, Any] | None) -> str:
    return COLOURS[category(cell)]


def cell_detail(cell: dict[str, Any]) -> str:
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


def spec_rows(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, values) rows of a matrix's definition: its axes, prompts and shared settings."""
    from ..config import axes
    from ..matrix.cells import model_label
    from ..matrix.spec import axis_label
    from ..matrix.summary import axis_value_label

    prompts = []
    for p in spec.get("prompts", []):
        cat = f" [{p['category']}]" if p.get("category") else ""
        if p.get("tokens") is not None:
            prompts.append(f"{p['name']} ({len(p['tokens'])} raw tokens){cat}")
        else:
            prompts.append(f"{p['name']}{cat}")
    eng = spec.get("engine") or {}
    rows = [
        ("targets", ", ".join(model_label(t) for t in spec.get("targets", []))),
        ("drafters", ", ".join(model_label(t) for t in spec.get("drafters", []))),
    ]
    rows += [(axis_label(a), ", ".join(axis_value_label(a, x) for x in spec.get(a, []))) for a in axes()]
    rows += [
        ("prompts", ", ".join(prompts)),
        ("max tokens", str(spec.get("max_tokens"))),
        ("engine", ", ".join(f"{k}={v}" for k, v in eng.items() if k not in axes())),
    ]
    if spec.get("stop_after_fork") is not None:
        rows.append(("stop after fork", f"{spec['stop_after_fork']} tokens (the speculative arm)"))
    return rows
