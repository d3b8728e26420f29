"""Is the backend sane?  The same tokens teacher-forced on two setups of one model, compared position by position.

Before a fork is read as a near-tie or a bug, the backend itself must compute
the model as a reference does: a GPU build can be plainly wrong, not just
different (a ROCm build once gave perplexity 1334 where CPU and Vulkan gave
6.81).  This is ``llama-perplexity --kl-divergence`` in one command and without
a saved baseline file:

* **the pair**: the user's build with the GPU (``-ngl`` > 0 and a GPU the
  build can offload to) against the CPU (``-ngl 0``); on a CPU-only build, one
  thread against all threads (different reduction splits);
* **the tokens**: each prompt plus a greedy continuation computed by the
  reference (or, inside a diagnosis, the run's own prompt and vanilla tokens),
  teacher-forced through both in the same chunks;
* **the figures**, per prompt and over all positions: the KL divergence
  KL(reference || test) of the next-token distributions (mean, p99, max, in
  nats), the share of positions whose top-1 token is the same, the largest
  |logit difference| over the whole vocabulary, and both sides' perplexity
  over the prompt's own tokens.

A pair is **broken** when the mean KL is above :data:`KL_MEAN_LIMIT`, the
same-top-1 share is below :data:`TOP1_LIMIT`, or a logit is not finite.

**At every verify width** (1 to n_max + 1, :func:`width_figures`): a fixed
width can hide a kernel that is wrong only at some widths (a GPU's batched
path at M >= 2, a dispatch that changes at 4 or 8).  So after the prompt's
prefill, the continuation's positions are fed in passes of exactly W tokens,
the shape of a verify pass of W rows, on both setups (positions past the last
whole pass are left out: a narrower pass would compute them), and per width
the same figures are given for three comparisons:

* ``pair``: the test against the reference at the same width (is the backend
  sane at this width);
* ``drift``: the test at width W against the test at width 1 (what a verify
  pass of W rows moves against the rows plain decoding computes: the measured
  envelope the near-tie bands are calibrated from);
* ``reference_drift``: the same for the reference.

A width whose pair is broken makes the whole check broken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..config import EngineSettings, default_threads
from ..engine import Engine
from ..errors import SpecviewError
from ..eta import WorkEta
from ..arms.generate import GenOptions, run_to_end, vanilla_greedy
from ..registry import Runner, get_backend

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]

#: a pair whose mean KL divergence (nats per position) is above this is broken: it moves the model more than
#: requantizing it from F16 to 8 bits does.  Measured on the demo (403 positions of the built-in prompts): F16
#: against Q8_0 0.0036, against Q4_K_M 0.046, against Q4_0 0.30; one thread against two on this CPU build 0
#: (bit-identical); see docs/diagnosis.md.
KL_MEAN_LIMIT = 0.01
#: a pair whose top-1 tokens agree at fewer than this share of positions is broken (demo, F16 against Q8_0:
#: 96.5%, against Q4_K_M 87.1%, against Q4_0 76.2%)
TOP1_LIMIT = 0.95
#: greedy tokens the reference adds after each prompt in ``specview check``
DEFAULT_CONTINUATION = 64
#: rows of logits held per engine at a time (memory O(n_vocab x CHUNK))
CHUNK = 64


class BackendCheckCancelled(SpecviewError):
    """The caller's cancel check returned True during the backend check."""


@dataclass(frozen=True)
class Pair:
    """The two setups compared: the reference and the build under test."""

    kind: str  # "gpu-vs-cpu" or "threads"
    reference: EngineSettings
    test: EngineSettings
    reference_label: str
    test_label: str


def gpu_build(backend: str) -> bool:
    """Whether the engine's build can offload to a GPU (its environment says ``gpu_offload``)."""
    try:
        return bool(get_backend(backend).environment().get("gpu_offload"))
    except SpecviewError:
        return False


def choose_pair(backend: str, settings: EngineSettings, *, cpu_count: int | None = None) -> Pair | str:
    """The pair to compare for these settings, or the reason there is none."""
    if settings.gpu_layers != 0 and gpu_build(backend):
        ngl = "all" if settings.gpu_layers < 0 else str(settings.gpu_layers)
        # -ngl 0 alone is not the CPU: a GPU build still computes batches of >= 32 tokens on the GPU (op offload)
        return Pair("gpu-vs-cpu", reference=replace(settings, gpu_layers=0, no_op_offload=True), test=settings,
                    reference_label="CPU (-ngl 0 --no-op-offload)", test_label=f"GPU (-ngl {ngl})")
    n = settings.threads if settings.threads > 1 else (cpu_count or default_threads())
    if n <= 1:
        return ("this is a CPU-only build on one core: there is no GPU to compare with the CPU and no second "
                "thread split to compare with one thread")
    return Pair("threads", reference=replace(settings, threads=1), test=replace(settings, threads=n),
                reference_label="1 thread", test_label=f"{n} threads")


def wanted_for(cfg: Any) -> bool:
    """Whether a diagnosis runs the check unasked: when the run's target was offloaded to a GPU."""
    return cfg.engine.gpu_layers != 0 and gpu_build(cfg.backend)


# -- figures ---------------------------------------------------------------------------
def _log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    m = np.max(x, axis=1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=1, keepdims=True))


def compare_rows(ref: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """Per row: KL(ref || test) in nats, same top-1, max |logit difference|, and whether the test row is finite."""
    finite = np.all(np.isfinite(test), axis=1) & np.all(np.isfinite(ref), axis=1)
    kl = np.full(len(ref), np.inf)
    delta = np.full(len(ref), np.inf)
    if finite.any():
        r, t = ref[finite], test[finite]
        lr, lt = _log_softmax(r), _log_softmax(t)
        kl[finite] = np.maximum(np.sum(np.exp(lr) * (lr - lt), axis=1), 0.0)
        delta[finite] = np.max(np.abs(r.astype(np.float64) - t.astype(np.float64)), axis=1)
    same = np.argmax(np.nan_to_num(ref, nan=-np.inf), axis=1) == np.argmax(np.nan_to_num(test, nan=-np.inf), axis=1)
    return {"kl": kl, "same_top1": same & finite, "max_delta": delta, "finite": finite}


def summarize(kl: Sequence[float], same: Sequence[bool], delta: Sequence[float], finite: Sequence[bool],
              nll_ref: Sequence[float] = (), nll_test: Sequence[float] = ()) -> dict[str, Any]:
    """The figures over a set of positions (non-finite rows count as disagreeing and are reported apart)."""
    kl_a = np.asarray(kl, dtype=np.float64)
    fin = np.asarray(finite, dtype=bool)
    n = len(kl_a)
    k = kl_a[fin]

    def ppl(nll: Sequence[float]) -> float | None:
        a = np.asarray(nll, dtype=np.float64)
        if len(a) == 0 or not np.all(np.isfinite(a)):
            return None if len(a) == 0 else float("inf")
        return float(np.exp(a.mean()))

    return {
        "positions": n,
        "non_finite": int(n - fin.sum()),
        "kl_mean": float(k.mean()) if len(k) else None,
        "kl_p99": float(np.percentile(k, 99)) if len(k) else None,
        "kl_max": float(k.max()) if len(k) else None,
        "same_top1": float(np.mean(np.asarray(same, dtype=bool))) if n else None,
        "max_logit_delta": float(np.max(np.asarray(delta, dtype=np.float64)[fin])) if fin.any() else None,
        "ppl_reference": ppl(nll_ref),
        "ppl_test": ppl(nll_test),
    }


def problems_of(totals: dict[str, Any], *, kl_limit: float = KL_MEAN_LIMIT, top1_limit: float = TOP1_LIMIT
                ) -> list[str]:
    """Why the figures make the backend broken (empty: sane)."""
    out = []
    if totals.get("non_finite"):
        out.append(f"{totals['non_finite']} positions with logits that are not finite (NaN or infinite)")
    if totals.get("kl_mean") is not None and totals["kl_mean"] > kl_limit:
        out.append(f"mean KL divergence {totals['kl_mean']:.4g} nats is above the limit {kl_limit:g}")
    if totals.get("same_top1") is not None and totals["same_top1"] < top1_limit:
        out.append(f"the top-1 token agrees at only {totals['same_top1']:.1%} of positions (limit {top1_limit:.0%})")
    return out


# -- teacher forcing ---------------------------------------------------------------------
def teacher_force(ref: Engine, test: Engine, tokens: Sequence[int], *, n_prompt: int, cancel: CancelFn,
                  chunk: int = CHUNK) -> dict[str, Any]:
    """Feed ``tokens`` through both engines in the same chunks, comparing every row; the per-prompt figures."""
    if len(tokens) == 0:
        raise SpecviewError("the backend check needs at least one token per prompt")
    chunk = max(1, min(chunk, ref.n_batch, test.n_batch))
    ref.reset()
    test.reset()
    kl: list[float] = []
    same: list[bool] = []
    delta: list[float] = []
    finite: list[bool] = []
    nll_r: list[float] = []
    nll_t: list[float] = []
    for start in range(0, len(tokens), chunk):
        if cancel():
            raise BackendCheckCancelled("backend check cancelled")
        part = list(tokens[start:start + chunk])
        rows = range(len(part))
        a = ref.eval(part, rows=rows)
        b = test.eval(part, rows=rows)
        c = compare_rows(a, b)
        kl.extend(c["kl"].tolist())
        same.extend(c["same_top1"].tolist())
        delta.extend(c["max_delta"].tolist())
        finite.extend(c["finite"].tolist())
        # perplexity over the prompt's own tokens: row i predicts token i + 1
        for i in range(len(part)):
            pos = start + i
            if pos + 1 < n_prompt:
                nxt = int(tokens[pos + 1])
                nll_r.append(-float(_log_softmax(a[i:i + 1])[0, nxt]))
                nll_t.append(-float(_log_softmax(b[i:i + 1])[0, nxt]) if np.all(np.isfinite(b[i])) else np.inf)
    out = summarize(kl, same, delta, finite, nll_r, nll_t)
    out["_raw"] = (kl, same, delta, finite, nll_r, nll_t)
    return out


def full_passes(n: int, width: int) -> int:
    """How many of ``n`` positions passes of exactly ``width`` tokens cover (the rest would be a narrower pass)."""
    return (n // width) * width


def _forced_rows(eng: Engine, tokens: Sequence[int], *, start: int, width: int, cancel: CancelFn) -> np.ndarray:
    """The rows of positions ``start``.. of ``tokens`` computed in passes of exactly ``width`` tokens, after a
    prefill of the tokens before ``start`` in chunks (the shape of a verify pass of ``width`` rows after a
    prompt); positions past the last whole pass are left out, as a narrower pass would compute them."""
    eng.reset()
    chunk = max(1, min(CHUNK, eng.n_batch))
    for a in range(0, start, chunk):
        part = list(tokens[a:min(start, a + chunk)])
        eng.eval(part, rows=[len(part) - 1])
    out = []
    for a in range(start, start + full_passes(len(tokens) - start, width), width):
        if cancel():
            raise BackendCheckCancelled("backend check cancelled")
        part = list(tokens[a:a + width])
        out.append(eng.eval(part, rows=range(len(part))))
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def width_rows(ref: Engine, test: Engine, tokens: Sequence[int], *, start: int, widths: Sequence[int],
               cancel: CancelFn) -> dict[int, dict[str, tuple[list, ...]]]:
    """Per width: the raw per-row figures (KL, same top-1, max |delta|, finite) of ``pair``, ``drift`` and
    ``reference_drift`` (see the module's docstring) over positions ``start``.. of ``tokens``."""
    if max(widths) > min(ref.n_batch, test.n_batch):
        raise SpecviewError(f"a verify width of {max(widths)} is more than the context's batch of "
                            f"{min(ref.n_batch, test.n_batch)} tokens: raise -b/--n-batch or give smaller widths")
    r1 = _forced_rows(ref, tokens, start=start, width=1, cancel=cancel)
    t1 = _forced_rows(test, tokens, start=start, width=1, cancel=cancel)
    out = {}
    for w in widths:
        n = full_passes(len(tokens) - start, w)
        if n == 0:  # fewer positions than one pass of this width
            continue
        rw = r1 if w == 1 else _forced_rows(ref, tokens, start=start, width=w, cancel=cancel)
        tw = t1 if w == 1 else _forced_rows(test, tokens, start=start, width=w, cancel=cancel)
        out[w] = {}
        for key, (a, b) in (("pair", (rw, tw)), ("drift", (t1[:n], tw)), ("reference_drift", (r1[:n], rw))):
            c = compare_rows(a, b)
            out[w][key] = (c["kl"].tolist(), c["same_top1"].tolist(), c["max_delta"].tolist(), c["finite"].tolist())
    return out


def _gather(by_width: dict[int, dict[str, list]], rows: dict[int, dict[str, tuple[list, ...]]]) -> None:
    """Append one prompt's per-width raw figures to those of the prompts before it."""
    for w, raw in rows.items():
        acc = by_width.setdefault(w, {})
        for key, cols in raw.items():
            into = acc.setdefault(key, [[], [], [], []])
            for i in range(4):
                into[i].extend(cols[i])


def widths_upto(n_max: int) -> list[int]:
    """The verify widths a run with ``n_max`` drafts per round can take: 1 to n_max + 1."""
    return list(range(1, max(0, int(n_max)) + 2))


def _round(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if k == "_raw":
            continue
        if isinstance(v, float):
            v = float(f"{v:.6g}") if np.isfinite(v) else None  # JSON has no infinity: non_finite counts them
        out[k] = v
    return out


def check_texts(session: Any, *, backend: str, target: str, settings: EngineSettings,
                texts: Iterable[tuple[str, str]], chat: bool = True, **kw: Any) -> dict[str, Any]:
    """:func:`run_check` over prompt texts (name, text), tokenized by the target as ``session`` loads it."""
    model = session.model(backend, target, settings)
    prompts = []
    for name, text in texts:
        toks = model.tokenize(text, chat=chat)
        if not toks:
            raise SpecviewError(f"the prompt {name!r} is empty: give some text")
        prompts.append((name, toks))
    return run_check(session, backend=backend, target=target, settings=settings, prompts=prompts, **kw)


def run_check(
    session: Any,
    *,
    backend: str,
    target: str,
    settings: EngineSettings,
    prompts: Iterable[tuple[str, list[int]]],
    continuation: int = DEFAULT_CONTINUATION,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    pair: Pair | None = None,
    kl_limit: float = KL_MEAN_LIMIT,
    top1_limit: float = TOP1_LIMIT,
    widths: Sequence[int] = (),
    verify_from: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The backend check over ``prompts`` (name, token ids), each followed by ``continuation`` greedy tokens.

    ``widths`` adds the per-width figures (:func:`width_figures`) over each
    prompt's positions from ``verify_from[name]`` (default: its continuation).

    ``session`` loads the target (a :class:`~specview.core.session.Session`).
    Returns a JSON-able dict: the pair, per-prompt and total figures, the
    limits, ``ok`` and the ``problems`` found.
    """
    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t0 = time.perf_counter()
    prompts = [(name, list(toks)) for name, toks in prompts]
    if not prompts:
        raise SpecviewError("the backend check needs at least one prompt")
    if continuation < 0:
        raise SpecviewError(f"the continuation must be >= 0 tokens (got {continuation})")
    # decided (Runner.job resolved them; a direct call gets the same door), as a run's are
    settings = Runner.resolve_settings(settings, backend=backend, target=target)[0]
    chosen = pair if pair is not None else choose_pair(backend, settings)
    base: dict[str, Any] = {
        "kind": None, "reference_label": None, "test_label": None, "target": target, "prompts": [],
        "totals": None, "limits": {"kl_mean": kl_limit, "same_top1": top1_limit}, "ok": None, "problems": [],
        "continuation": continuation, "seconds": None, "skipped": None, "widths": None,
    }
    widths = sorted({int(w) for w in widths})
    if widths and widths[0] < 1:
        raise SpecviewError(f"a verify width is at least 1 token (got {widths[0]})")
    if isinstance(chosen, str):
        base["skipped"] = chosen
        base["seconds"] = round(time.perf_counter() - t0, 3)
        return base
    base.update(kind=chosen.kind, reference_label=chosen.reference_label, test_label=chosen.test_label)
    m_ref = session.model(backend, target, chosen.reference)
    m_test = session.model(backend, target, chosen.test)
    n_ctx = max(len(t) for _, t in prompts) + continuation
    n_ctx = ((n_ctx + 255) // 256) * 256
    e_ref = session.engine("check-reference", m_ref, chosen.reference, n_ctx)
    e_test = session.engine("check-test", m_test, chosen.test, n_ctx)
    raws = []
    by_width: dict[int, dict[str, list]] = {}
    # one line per prompt with an estimate of the rest (a slow backend takes minutes per prompt)
    eta = WorkEta({name: len(toks) + continuation for name, toks in prompts}, label=f"backend check: {target}",
                  unit="positions", every=0.0)
    for name, toks in prompts:
        if cancel():
            raise BackendCheckCancelled("backend check cancelled")
        fig = _check_prompt(e_ref, e_test, chosen, name, toks, continuation=continuation, say=say, cancel=cancel,
                            start=(verify_from or {}).get(name, len(toks)), widths=widths, by_width=by_width)
        raws.append(fig["_raw"])
        base["prompts"].append({"name": name, **_round(fig)})
        if len(prompts) > 1 and (line := eta.done(name, len(toks) + continuation, what=f"{name} done")):
            say(line)
    joined = [sum((list(r[i]) for r in raws), []) for i in range(6)]
    totals = summarize(*joined)
    base["totals"] = _round(totals)
    base["problems"] = problems_of(totals, kl_limit=kl_limit, top1_limit=top1_limit)
    if widths:
        base["widths"] = [{"width": w, **{k: _round(summarize(*cols)) for k, cols in by_width[w].items()}}
                          for w in widths if w in by_width]
        base["problems"] += [f"at width {row['width']}: {p}" for row in base["widths"]
                             for p in problems_of(row["pair"], kl_limit=kl_limit, top1_limit=top1_limit)]
    base["ok"] = not base["problems"]
    base["seconds"] = round(time.perf_counter() - t0, 3)
    return base


def _check_prompt(e_ref: Engine, e_test: Engine, chosen: Pair, name: str, toks: list[int], *, continuation: int,
                  say: ProgressFn, cancel: CancelFn, start: int, widths: Sequence[int],
                  by_width: dict[int, dict[str, list]]) -> dict[str, Any]:
    """One prompt of the check: its greedy continuation on the reference, the teacher-forced figures, and its
    rows at every width from ``start`` gathered into ``by_width``."""
    seq = list(toks)
    if continuation:
        say(f"backend check: {name}: {continuation} greedy tokens on the reference ({chosen.reference_label})")
        arm = run_to_end(vanilla_greedy(e_ref, seq, GenOptions(max_tokens=continuation, n_batch=e_ref.n_batch),
                                        cancel=cancel))
        if arm.stop_reason == "cancelled":
            raise BackendCheckCancelled("backend check cancelled")
        seq = seq + arm.tokens[:-1]  # the last token's own row would predict beyond the text
    say(f"backend check: {name}: {len(seq)} positions teacher-forced on {chosen.reference_label} and "
        f"{chosen.test_label}")
    fig = teacher_force(e_ref, e_test, seq, n_prompt=len(toks), cancel=cancel)
    if widths and start < len(seq):
        say(f"backend check: {name}: {len(seq) - start} positions at verify widths {', '.join(map(str, widths))}")
        _gather(by_width, width_rows(e_ref, e_test, seq, start=start, widths=widths, cancel=cancel))
    return fig


def reference_for_trace(session: Any, cfg: Any, trace: Any, *, progress: ProgressFn | None = None,
                        cancel: CancelFn | None = None) -> dict[str, Any]:
    """The check inside a diagnosis: the run's own prompt and vanilla tokens, teacher-forced on the pair."""
    prompt = [int(t) for t in trace.prompt["tokens"]]
    seq = prompt + list(trace.vanilla.tokens[:-1])
    pair = choose_pair(cfg.backend, cfg.engine)
    if not isinstance(pair, str):
        # the run's own thread count (or GPU setting) is the side under test
        used = trace.config.get("threads_used")
        if pair.kind == "threads" and isinstance(used, int) and used > 1:
            pair = replace(pair, test=replace(pair.test, threads=used), test_label=f"{used} threads")
    return run_check(session, backend=cfg.backend, target=cfg.target, settings=cfg.engine,
                     prompts=[("run", seq)], continuation=0, progress=progress, cancel=cancel, pair=pair,
                     widths=widths_upto(_widest_draft(cfg, trace)), verify_from={"run": len(prompt)})


def _widest_draft(cfg: Any, trace: Any) -> int:
    """The most drafts one of the run's verify passes carried (its rounds'), else what the settings allow: an
    n-gram drafter may allow 48 and draft 5, and on a GPU each new width can cost a shader compile."""
    drafted = [r.batch_size - 1 for r in trace.speculative.rounds if r.index > 0]
    return max(drafted) if drafted else cfg.draft_width


def format_check(result: dict[str, Any]) -> str:
    """The table ``specview check`` prints."""
    lines = []
    if result.get("skipped"):
        return f"backend check not run: {result['skipped']}"
    why = ("the GPU build against the CPU" if result["kind"] == "gpu-vs-cpu"
           else "a CPU-only build: all threads against one, different work splits")
    lines.append(f"backend check  {result['target']}: {result['test_label']} against {result['reference_label']} "
                 f"({why})")
    head = (f"{'prompt':<14} {'positions':>9} {'KL mean':>10} {'KL p99':>10} {'KL max':>10} {'same top-1':>10} "
            f"{'max |dlogit|':>12} {'ppl ref':>9} {'ppl test':>9}")
    lines.append(head)

    def num(x: Any, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    rows = list(result["prompts"]) + [{"name": "all", **(result["totals"] or {})}]
    for r in rows:
        lines.append(f"{r['name'][:14]:<14} {r['positions']:>9} {num(r['kl_mean'], '.3e'):>10} "
                     f"{num(r['kl_p99'], '.3e'):>10} {num(r['kl_max'], '.3e'):>10} "
                     f"{num(None if r['same_top1'] is None else 100 * r['same_top1'], '.2f') + '%':>10} "
                     f"{num(r['max_logit_delta'], '.4f'):>12} {num(r['ppl_reference'], '.3f'):>9} "
                     f"{num(r['ppl_test'], '.3f'):>9}")
    if result.get("widths"):
        lines.append("")
        lines.append("per verify width: the continuation fed in whole passes of W tokens on both sides (positions past "
                     "the last whole pass left out); pair = the test against the reference at W, drift = the test at "
                     "W against the test at width 1")
        head, rows = width_table(result)
        lines.append("  ".join(f"{h:>{len(h) if i else 5}}" for i, h in enumerate(head)))
        for r in rows:
            lines.append("  ".join(f"{v:>{len(h) if i else 5}}" for i, (h, v) in enumerate(zip(head, r))))
        lines.append("")
    lim = result["limits"]
    lines.append(f"limits  broken when the mean KL is above {lim['kl_mean']:g} nats, the same top-1 share is below "
                 f"{lim['same_top1']:.0%}, or a logit is not finite")
    if result["ok"]:
        lines.append("RESULT  ok: this build computes the model as the reference does, to rounding")
    else:
        lines.append("RESULT  BROKEN: " + "; ".join(result["problems"]) + ". Read nothing into a fork on this "
                     "backend until it is fixed; compare with -ngl 0 or another backend.")
    return "\n".join(lines)


WIDTH_HEADERS = ("width", "positions", "pair KL mean", "pair KL max", "pair same top-1", "pair max |Δ|",
                 "drift KL max", "drift same top-1", "drift max |Δ|", "ref drift max |Δ|")


def width_table(result: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The per-width figures of a check (its ``widths`` block) as headers and rows of plain strings."""
    def num(x: Any, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    def share(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    rows = []
    for w in result.get("widths") or []:
        p, d, r = w.get("pair") or {}, w.get("drift") or {}, w.get("reference_drift") or {}
        rows.append((str(w["width"]), str(p.get("positions")), num(p.get("kl_mean"), ".3e"),
                     num(p.get("kl_max"), ".3e"), share(p.get("same_top1")), num(p.get("max_logit_delta"), ".4g"),
                     num(d.get("kl_max"), ".3e"), share(d.get("same_top1")), num(d.get("max_logit_delta"), ".4g"),
                     num(r.get("max_logit_delta"), ".4g")))
    return WIDTH_HEADERS, rows
