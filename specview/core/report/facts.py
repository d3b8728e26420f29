"""The facts a report states, as (label, value) rows shared by the HTML and the Markdown report."""

from __future__ import annotations

from typing import Any, Mapping

from ..config import REPACKED_BUFFERS
from ..llama_flags import llama_commands, ngl_text
from ..resolve import decided
from ..verdicts import COLOURS, WORDS
from .escape import num, text, visible

CONTEXT_TOKENS = 8


def obj(value: Any) -> dict[str, Any]:
    """A mapping read from a file, or an empty one where the file holds something else."""
    return value if isinstance(value, dict) else {}


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def crash_of(trace: Any) -> dict[str, Any]:
    """The trace's ``crash`` block (the engine's worker died during the run), or {}."""
    return obj(obj(getattr(trace, "extra", None)).get("crash"))


def crash_warning(trace: Any) -> list[str] | None:
    """The account of the engine's death, a line each (the report says it first), or None."""
    crash = crash_of(trace)
    if not crash:
        return None
    from ..worker.death import message

    return message(crash).splitlines()


def verdict_of(trace: Any) -> str:
    if crash_of(trace) and trace.comparison.identical:
        return "crashed"
    if trace.comparison.identical:
        return "identical"
    return text(obj(trace.diagnosis).get("verdict")) or "diverged"


def headline(trace: Any) -> str:
    c = trace.comparison
    v = verdict_of(trace)
    if v == "crashed":
        return (f"The engine crashed after {len(trace.vanilla.tokens)} vanilla and {len(trace.speculative.tokens)} "
                f"speculative tokens; up to there the arms agree on all {text(c.agree)} tokens both have.")
    if c.identical:
        return f"Identical: both arms produced the same {text(c.agree)} tokens."
    fm = c.first_mismatch
    return (f"Speculative decoding diverges from plain greedy at token {text(fm.index)} "
            f"(character {text(fm.char_offset)}): {WORDS.get(v, v)}.")


def fmt(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return text(x)


def _step(arm: Any, i: int | None) -> Any:
    return arm.steps[i] if i is not None and i < len(arm.steps) else None


def backend_warning(trace: Any) -> str | None:
    """The diagnosis' backend check when it found this build broken (the report says it before the fork), else None."""
    from ..diagnose import reference_line

    ref = obj(obj(trace.diagnosis).get("reference"))
    if ref.get("ok") is not False:
        return None
    return reference_line(ref)


def verdict_facts(trace: Any) -> list[tuple[str, str]]:
    """(label, value) rows: the verdict and the numbers behind it."""
    c, v, s = trace.comparison, trace.vanilla, trace.speculative
    rows = [("verdict", WORDS.get(verdict_of(trace), verdict_of(trace)))]
    if c.identical:
        rows.append(("tokens compared", text(c.agree)))
    else:
        fm = c.first_mismatch
        rows.append(("first mismatch", f"token {text(fm.index)} (character {text(fm.char_offset)}); "
                                       f"{text(c.agree)} tokens agree"))
        rows.append(("vanilla token", f"{text(fm.vanilla_token)} {visible(fm.vanilla_piece)!r}"))
        rows.append(("speculative token", f"{text(fm.speculative_token)} {visible(fm.speculative_piece)!r}"))
        i = _index(fm.index)
        vs, ss = _step(v, i), _step(s, i)
        if vs is not None:
            rows.append(("vanilla top-1/top-2 margin at the fork", num(vs.margin, unit=" logits")))
        if ss is not None and ss.round is None:
            rows.append(("speculative token came from", "not reported by this engine"))
        elif ss is not None:
            kind = "an accepted draft token" if ss.from_draft else "the target's own token"
            rows.append(("speculative token came from",
                         f"{kind}, round {text(ss.round)}, row {text(ss.batch_index)} of a "
                         f"T={text(ss.batch_size)} forward pass"))
    d = obj(trace.diagnosis)
    if d:
        if d.get("gap") is not None:
            rows.append(("gap (teacher-forced, one token per pass)",
                         f"{num(d['gap'])} logits for the vanilla token"))
        sp = obj(obj(d.get("replays")).get("speculative"))
        if isinstance(sp.get("gap"), (int, float)):
            rows.append((f"gap in the speculative shape ({text(sp.get('shape', 'verify pass'))})",
                         f"{num(sp['gap'])} logits for the speculative token"))
        env = obj(d.get("envelope"))
        if env.get("max") is not None:
            rows.append(("numeric envelope before the fork",
                         f"max {fmt(env.get('max'))}, p95 {fmt(env.get('p95'))}, median {fmt(env.get('median'))} "
                         f"logits over {text(env.get('positions', '?'))} positions"))
        th = obj(d.get("thresholds"))
        if th.get("far") is not None:
            rows.append(("thresholds", f"near-tie ≤ {fmt(th.get('near_tie'))}, state bug > {fmt(th.get('far'))} logits"))
        if isinstance(d.get("at_risk"), list) and th.get("at_risk") is not None:
            rows.append((f"vanilla positions at risk (margin below {fmt(th.get('at_risk'))})", str(len(d["at_risk"]))))
        if d.get("rule"):
            rows.append(("rule", text(d["rule"])))
        dep = obj(d.get("departure"))
        if dep:
            rows.append(("where the verify pass departs",
                         f"not located ({text(dep['skipped'])})" if dep.get("skipped") else
                         f"row {text(dep.get('row'))} of the width-{text(dep.get('width'))} pass: "
                         f"{text(dep.get('where'))}"))
        ref = obj(d.get("reference"))
        if ref:
            from ..diagnose import reference_line

            rows.append(("backend check", text(reference_line(ref)).replace("backend check  ", "", 1)))
    elif not c.identical:
        rows.append(("diagnosis", "not run (specview run --diagnose explains the fork)"))
    return rows


def acceptance_facts(trace: Any) -> list[tuple[str, str]]:
    v, s = trace.vanilla, trace.speculative
    rate, mean = s.acceptance_rate, s.mean_accepted
    speed = s.tokens_per_s / v.tokens_per_s if v.tokens_per_s > 0 else None
    return [
        ("drafter", text(obj(trace.config).get("spec_type"))),
        ("verify rounds", str(max(0, len(s.rounds) - 1))),
        ("drafted / accepted", f"{text(s.n_drafted)} / {text(s.n_accepted)}"),
        ("acceptance rate", num(rate, ".1%")),
        ("mean tokens per round", num(mean, ".2f")),
        ("vanilla", f"{v.tokens_per_s:.1f} tok/s, {len(v.tokens)} tokens ({text(v.stop_reason)})"),
        ("speculative", f"{s.tokens_per_s:.1f} tok/s, {len(s.tokens)} tokens ({text(s.stop_reason)})"),
        ("speedup", num(speed, ".2f", unit="x")),
    ]


def config_facts(trace: Any) -> list[tuple[str, str]]:
    cfg = obj(trace.config)
    eng = obj(cfg.get("engine"))
    g = lambda d, k: text(d.get(k))  # noqa: E731
    rows = [
        ("spec type", g(cfg, "spec_type")),
        ("n_max / n_min / p_min", f"{g(cfg, 'n_max')} / {g(cfg, 'n_min')} / {g(cfg, 'p_min')}"),
        ("max tokens", g(cfg, "max_tokens")),
        ("context", f"{text(cfg.get('n_ctx_used', eng.get('n_ctx')))} (n_batch {g(eng, 'n_batch')}, "
                    f"n_ubatch {g(eng, 'n_ubatch')})"),
        ("flash attention", g(eng, "flash_attn")),
        ("KV cache type", g(eng, "kv_type")),
        ("GPU layers", ngl_text(eng.get("gpu_layers")) if _small_int(eng.get("gpu_layers")) else "n/a"),
        ("threads", text(eng.get("threads")) or "all cores"),
        ("weight repack", repack_text(cfg, getattr(trace, "models", None))),
    ]
    feats = cpu_features_text(obj(trace.environment))
    if feats:
        rows.append(("CPU features", feats))
    if cfg.get("spec_type") == "ngram-simple":
        rows.insert(2, ("ngram size n / m", f"{g(cfg, 'ngram_size_n')} / {g(cfg, 'ngram_size_m')}"))
    if cfg.get("stop_after_fork") is not None:
        rows.append(("stop after fork", f"{g(cfg, 'stop_after_fork')} tokens (the speculative arm)"))
    return rows


def repack_text(cfg: dict[str, Any], models: Any = None) -> str:
    """How the run held its weights: repacked (llama.cpp's default) or not (``--no-repack``), and why
    (a trace's ``config`` block: the machine's reason is in its ``decided`` block); with the trace's ``models``,
    what repacking on did: which model's weights went into a repacked buffer, or that none did (a type or a CPU
    ggml-cpu repacks nothing for, a GPU's host buffer), which a reader of "on" cannot tell."""
    if obj(cfg.get("engine")).get("no_repack") is not True:
        return "on (llama.cpp's default)" + _repacked(obj(models))
    why = decided(cfg, "no_repack")
    return f"off (--no-repack): {text(why)}" if why else "off (--no-repack, as asked)"


def _repacked(models: dict[str, Any]) -> str:
    """What follows "on" from the models' ``weight_buffers``: ": target 7.6 MiB, draft 57.0 MiB in CPU_REPACK";
    ", but no weights were repacked" where they name no repacked buffer; "" where no model recorded its buffers."""
    buffers = {role: obj(obj(models.get(role)).get("weight_buffers")) for role in ("target", "draft")}
    said = []
    for b in REPACKED_BUFFERS:
        held = [f"{role} {num(bufs[b], '.1f', unit=' MiB')}" for role, bufs in buffers.items() if b in bufs]
        if held:
            said.append(f"{', '.join(held)} in {b}")
    if said:
        return ": " + "; ".join(said)
    return ", but no weights were repacked" if any(buffers.values()) else ""


def cpu_features_text(env: dict[str, Any]) -> str:
    """The CPU features that pick kernels, as the run's setup recorded them ("AVX2, AVX-512, AMX"); "" if none."""
    setup = obj(env.get("setup"))
    feats = setup.get("machine.cpu_features")
    if not isinstance(feats, list) or not feats:
        return ""
    return ", ".join(text(f) for f in feats[:16])


def _small_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2 ** 31


def model_facts(trace: Any) -> list[tuple[str, str, str]]:
    """(fact, target, draft) rows."""
    t = obj(trace.models.get("target"))
    d = obj(trace.models.get("draft"))
    keys = [("file", "file"), ("quantization", "quantization"), ("weights held in", "weight_buffers"),
            ("architecture", "architecture"),
            ("name", "name"), ("parameters", "n_params"), ("file size", "file_size"), ("vocabulary", "n_vocab"),
            ("vocab fingerprint", "vocab_fingerprint"), ("description", "description")]
    rows = []
    for label, k in keys:
        a, b = t.get(k), d.get(k)
        if k == "weight_buffers":
            a, b = buffers_text(a), buffers_text(b)
        if a is None and b is None:
            continue
        if k in ("file_size", "n_params"):
            unit = " MB" if k == "file_size" else " M"
            a = num(a / 1e6, ".1f", unit=unit) if _small_number(a) else a
            b = num(b / 1e6, ".1f", unit=unit) if _small_number(b) else b
        rows.append((label, "-" if a is None else text(a), "-" if b is None else text(b)))
    return rows


def buffers_text(value: Any) -> Any:
    """A model's ``weight_buffers`` ({"CPU_REPACK": 56.95, ...}, MiB) as "CPU_REPACK 57.0 MiB, CPU_Mapped 28.4 MiB";
    anything else a file holds there as it is (None stays None)."""
    if not isinstance(value, dict):
        return value
    if not value:
        return None
    parts = [f"{text(name)} {num(mib, '.1f', unit=' MiB')}" for name, mib in list(value.items())[:8]]
    return ", ".join(parts) + (", …" if len(value) > 8 else "")


def _small_number(x: Any) -> bool:
    return not isinstance(x, bool) and (isinstance(x, float) or (isinstance(x, int) and x.bit_length() < 1000))


def environment_facts(env: Any) -> list[tuple[str, str]]:
    env = obj(env)
    order = ["specview", "backend", "llama_cpp_python", "os", "platform", "machine", "cpu", "python",
             "gpu_offload", "ggml_devices", "llama_cpp_system_info", "created"]
    rows = []
    for k in order + sorted(set(env) - set(order)):
        if k in env and env[k] not in (None, "", []):
            rows.append((k, text(env[k])))
    return rows


def fork_context(trace: Any, n: int = CONTEXT_TOKENS) -> dict[str, Any] | None:
    """Tokens around the fork: the shared tokens before it and each arm's fork token and what follows."""
    c = trace.comparison
    if c.identical or c.first_mismatch is None or _index(c.first_mismatch.index) is None:
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
                "Top-1 minus top-2 logit of the row that chose each token, for both arms. "
                "The dashed red line marks the fork; the shaded band is the replay envelope, how far the "
                "batched and single-token shapes move the logits on the shared prefix."),
    "margins_zoom": ("Top-1/top-2 margin around the fork",
                     "The margin plot again, zoomed on the tokens just before and after the fork."),
    "locate": ("|Δ| along the graph",
               "Max |Δ| of each compared node between the single-token pass and the batched row, in graph order "
               "(log scale; bit-identical nodes sit on the bottom line). The red line marks the first node that "
               "differs; the shaded bands are the layers."),
    "acceptance": ("Acceptance per round",
                   "Tokens drafted (grey) and accepted (green) in each verify round; the red line marks the "
                   "round that produced the fork."),
}


def prompt_block(trace: Any) -> tuple[str, str]:
    """(label, text) for the prompt: its text, or the raw token ids."""
    p = obj(trace.prompt)
    toks = p.get("tokens") if isinstance(p.get("tokens"), list) else []
    if p.get("raw_tokens") or p.get("text") is None:
        return (f"raw token ids ({len(toks)} tokens, no template, no BOS added)", " ".join(text(t) for t in toks))
    how = "with the model's chat template" if p.get("chat") else "as plain text, no template"
    return (f"text, {how} ({len(toks)} tokens after tokenizing)", text(p.get("text")))


def trace_title(trace: Any) -> str:
    t, d, cfg = obj(trace.models.get("target")), obj(trace.models.get("draft")), obj(trace.config)
    drafter = text(cfg.get("spec_type"))
    if drafter == "draft-simple":
        drafter = f"{text(d.get('file', cfg.get('draft')))} ({text(d.get('quantization', '?'))})"
    return f"{text(t.get('file', cfg.get('target')))} ({text(t.get('quantization', '?'))}) with {drafter}"


def commands(trace: Any) -> dict[str, str] | str:
    """The llama.cpp commands that reproduce the trace, or why there are none.

    They are built from the trace's settings only once those read back as a valid run
    (:meth:`RunConfig.from_dict` checks every value as declared), plus the context size and
    thread count the run used, and the model paths and prompt token ids as recorded.
    """
    from ..config import RunConfig
    from ..errors import SpecviewError

    raw = obj(trace.config)
    try:
        cfg = RunConfig.from_dict(raw).to_dict()
    except SpecviewError as exc:
        return f"no llama.cpp commands: the trace's settings are not a valid run ({text(str(exc))})"
    for key in ("n_ctx_used", "threads_used"):
        if _small_int(raw.get(key)) and raw[key] >= 0:
            cfg[key] = raw[key]
    models = {role: {"path": m["path"]} if isinstance(m.get("path"), str) else {}
              for role, m in ((r, obj(trace.models.get(r))) for r in ("target", "draft"))}
    p = obj(trace.prompt)
    toks = [t for t in p.get("tokens") or [] if _small_int(t)]
    prompt = {"text": p.get("text") if isinstance(p.get("text"), str) else None, "chat": p.get("chat") is True,
              "raw_tokens": p.get("raw_tokens") is True, "tokens": toks}
    return llama_commands(cfg, models, prompt)


def quoted(piece: str | None) -> str:
    return "(end of output)" if piece is None else f"'{visible(piece)}'"


def cell_colour(cell: dict[str, Any] | None) -> str:
    """A matrix cell's colour in a report: its category's (a cell that drafted nothing is inconclusive)."""
    from ..matrix.summary import cell_category

    return COLOURS[cell_category(cell)]


def cell_detail(cell: dict[str, Any]) -> str:
    from ..matrix.quality import cell_mark

    bits = [cell_mark(cell)] if cell_mark(cell) else []  # over a task suite: whether the answer changed
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
    from ..matrix.settings import axis_label
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


def preset_command(spec: dict[str, Any]) -> str | None:
    """The ``specview matrix --preset`` line that reruns a preset matrix with its models and run length."""
    import shlex

    preset = spec.get("preset") if isinstance(spec.get("preset"), dict) else None
    if not spec.get("parts") or not preset or not isinstance(preset.get("name"), str):
        return None
    flags = [("--model", f"{role}={m['model']}") for role, m in (preset.get("models") or {}).items()
             if isinstance(m, dict) and isinstance(m.get("model"), str)]
    if isinstance(spec.get("max_tokens"), int):
        flags.append(("-n", str(spec["max_tokens"])))
    threads = (spec.get("engine") or {}).get("threads")
    if isinstance(threads, int) and threads > 0:
        flags.append(("-t", str(threads)))
    lines = [f"specview matrix --preset {shlex.quote(preset['name'])}"]
    lines += [f"    {flag} {shlex.quote(value)}" for flag, value in flags]
    return " \\\n".join(lines)
