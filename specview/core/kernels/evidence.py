"""The kernel map as evidence: what it predicts about one run, and when a run contradicts it.

A draft of ``n_max`` tokens uses verify widths ``1..n_max+1``.  For a run of a
target under some engine settings, the kernel map (:mod:`specview.core.kernels.map`)
makes one of four predictions (:data:`STATUSES`):

``proven-lossless``
    the map has this target under these settings, its width-1 control held,
    and every width ``1..n_max+1`` was bit-identical to single-token passes:
    batched numerics cannot make the arms differ.  A fork there
    **contradicts the map**: a state bug in the loop or its cache, or a shape
    the map did not measure (a longer context, another build).
``kernels-differ``
    some width in range computes other bits than single-token passes: a fork is
    what the kernels predict is possible (not that one will happen).
``not-covered``
    the map lacks the target, its settings, its thread count or some width in
    range; ``missing`` says which.
``not-deterministic``
    the map's width-1 control failed for this target: it proves nothing.

The matching rules (``docs/kernels.md``, "Citing the map"):

* **The target.**  When both the run and the map row carry model file facts
  (``TargetMap.model``; a trace's ``models.target``), they decide: the same
  file name, size, quantization, parameter count and vocabulary fingerprint
  (each compared where both sides have it).  ``demo:Q4_K_M`` and the GGUF path
  it resolves to are then the same target, and a same-named file of another
  size is not.  No content hash is recorded, so a renamed copy is another
  target.  Without facts on one side (a ``--dry-run``), the names decide: demo
  names case-insensitively, paths as written, or the run's path equal to the
  row's recorded ``model.path``.
* **The settings.**  Every field of :attr:`EngineSettings.context_key` (the
  key the map's rows are keyed by: everything but the context size) must be
  equal, except the thread count, compared next.
* **The threads.**  The effective thread counts (``threads_used``, or the
  setting where that was not recorded) must be equal: the map's width-1
  control and every row were measured at its own thread count, and ggml
  splits attention across threads differently by count (a two-thread Q8_0
  demo run forks where the one-thread run does not), so a map made at ``-t 1``
  does not cover a run at ``-t 2``.
* **The engine.**  The run's engine must be the one the map was made on.
* **The environment.**  A map made on another CPU, llama.cpp build or device
  list still matches, with a caveat naming what differs.
* **The positions.**  A claim covers the KV positions its prompts reached;
  a run that goes further is still ``proven-lossless``, with a caveat.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..config import EngineSettings, RunConfig
from ..registry import Runner
from ..errors import SpecviewError
from .map import KernelMap, KernelMapError, TargetMap
from .text import ranges, settings_label

PROVEN, DIFFER, NOT_COVERED, NOT_DETERMINISTIC = "proven-lossless", "kernels-differ", "not-covered", "not-deterministic"
STATUSES = (PROVEN, DIFFER, NOT_COVERED, NOT_DETERMINISTIC)
#: how a summary or a report names each prediction
STATUS_WORDS = {
    PROVEN: "proven lossless",
    DIFFER: "kernels differ: a fork is possible",
    NOT_COVERED: "not covered by the map",
    NOT_DETERMINISTIC: "the map proves nothing (its control failed)",
}
#: model facts that identify a file (compared where both sides have them; "file" must be on both)
IDENTITY_KEYS = ("file", "file_size", "quantization", "n_params", "vocab_fingerprint")
#: environment keys whose difference between the map and a run is worth a caveat (the kernels' build and machine)
ENV_KEYS = ("backend", "llama_cpp_python", "llama_cpp_system_info", "ggml_backends", "ggml_devices", "gpu_offload",
            "cpu", "machine", "mlx", "mlx_lm", "mlx_device")
#: the settings a map row is keyed by (context_key's fields) that must match exactly; threads are compared apart
KERNEL_SETTINGS = tuple(f.name for f in fields(EngineSettings) if f.compare and f.name not in ("n_ctx", "threads"))
#: the rollback of a map row (or a run) recorded before rollbacks were decided for every target: the mode its
#: contexts took is not known, so it is not held against the other side's
UNRECORDED_ROLLBACK = "auto"
SERIAL_CHECK = "run `specview run --serial-verify` with these settings"
#: how the caveat of a run longer than the map's positions starts (a summary counts these instead of listing them)
REACH_CAVEAT = "this run reaches KV position"


@dataclass
class KernelPrediction:
    """What the kernel map says about one run (or one matrix cell)."""

    status: str
    target: str  # the run's target, as named
    n_max: int  # the most tokens a verify pass may carry beyond the target's own
    widths: list[int]  # the verify widths the run may use: 1..n_max+1 (1 alone with serial verify)
    settings: str = ""  # the run's settings that differ from the defaults, as the map labels them
    row: str | None = None  # the map row that matched (its label), None when none did
    safe_n_max: int | None = None  # that row's largest proven-lossless n_max
    first_differing: int | None = None  # kernels-differ: the first width in range that is not bit-identical
    identical_share: float | None = None  # ... the share of its rows that were bit-identical
    max_delta: float | None = None  # ... its largest |logit difference|
    flips: int | None = None  # ... its argmax flips
    missing: list[str] = field(default_factory=list)  # not-covered: what the map lacks
    evidence: str = ""  # what the claim rests on (TargetMap.evidence over the widths concerned)
    map_file: str | None = None
    map_reach: int | None = None  # the furthest KV position the row's prompts reached (prompt + positions)
    reach: int | None = None  # the furthest KV position the run reached (prompt + generated tokens), when known
    caveats: list[str] = field(default_factory=list)
    reason: str = ""  # one sentence

    @property
    def words(self) -> str:
        return STATUS_WORDS.get(self.status, self.status)

    def contradicts(self, identical: bool | None) -> bool:
        """A fork (``identical`` False) in a run the map proves lossless."""
        return self.status == PROVEN and identical is False

    def text(self) -> str:
        """One line: the status and why."""
        return f"{self.words}: {self.reason}" if self.reason else self.words

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "target": self.target, "settings": self.settings, "n_max": self.n_max,
            "widths": list(self.widths), "row": self.row, "safe_n_max": self.safe_n_max,
            "first_differing": self.first_differing,
            "identical_share": _round(self.identical_share), "max_delta": _round(self.max_delta), "flips": self.flips,
            "missing": list(self.missing), "evidence": self.evidence, "map_file": self.map_file,
            "map_reach": self.map_reach, "reach": self.reach, "caveats": list(self.caveats), "reason": self.reason,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "KernelPrediction":
        """From :meth:`to_json`'s output (a matrix file's cell; validated by its reader), tolerant of odd values."""

        def num(x: Any) -> float | None:
            return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

        def integer(x: Any) -> int | None:
            return x if isinstance(x, int) and not isinstance(x, bool) else None

        def strs(x: Any) -> list[str]:
            return [s for s in x if isinstance(s, str)] if isinstance(x, list) else []

        def text(x: Any) -> str:
            return x if isinstance(x, str) else ""

        return cls(
            status=text(d.get("status")) or NOT_COVERED, target=text(d.get("target")),
            n_max=integer(d.get("n_max")) or 0,
            widths=[w for w in (d.get("widths") or []) if integer(w) is not None] if isinstance(d.get("widths"), list)
            else [],
            settings=text(d.get("settings")), row=d.get("row") if isinstance(d.get("row"), str) else None,
            safe_n_max=integer(d.get("safe_n_max")), first_differing=integer(d.get("first_differing")),
            identical_share=num(d.get("identical_share")), max_delta=num(d.get("max_delta")),
            flips=integer(d.get("flips")), missing=strs(d.get("missing")), evidence=text(d.get("evidence")),
            map_file=d.get("map_file") if isinstance(d.get("map_file"), str) else None,
            map_reach=integer(d.get("map_reach")), reach=integer(d.get("reach")), caveats=strs(d.get("caveats")),
            reason=text(d.get("reason")),
        )


def _round(x: float | None, nd: int = 5) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.4g}"


def kernel_map_from_json(d: Any, *, source: str = "<kernel map>") -> KernelMap:
    """:meth:`KernelMap.from_json`, with whatever a malformed value makes it raise turned into a
    :class:`KernelMapError` naming ``source`` (an infinite position, settings out of range ...)."""
    try:
        return KernelMap.from_json(d, source=source)
    except KernelMapError:
        raise
    except SpecviewError as exc:
        raise KernelMapError(f"{source}: malformed kernel map ({exc})") from None
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise KernelMapError(f"{source}: malformed kernel map ({type(exc).__name__}: {exc})") from None


def as_kernel_map(kmap: KernelMap | Mapping[str, Any] | str | os.PathLike[str], *, source: str | None = None
                  ) -> KernelMap:
    """A :class:`KernelMap` from itself, its JSON, or a file (a :class:`KernelMapError` naming it otherwise)."""
    if isinstance(kmap, KernelMap):
        return kmap
    if isinstance(kmap, (str, os.PathLike)):
        return load_kernel_map(kmap)
    return kernel_map_from_json(kmap, source=source or "<kernel map>")


def load_kernel_map(path: str | os.PathLike[str], *, what: str = "kernel map") -> KernelMap:
    """Read a map for citing it, with an error that names the file and says how to make one."""
    from ..jsonfile import read_json

    try:
        return kernel_map_from_json(read_json(path, KernelMapError), source=str(path))
    except KernelMapError as exc:
        msg = str(exc)
        if str(path) not in msg:
            msg = f"{path}: {msg}"
        raise KernelMapError(f"{what} {msg}") from None


# -- matching ----------------------------------------------------------------------------
def _norm_name(name: str) -> str:
    from ..demo import demo_quant, is_demo_name

    if is_demo_name(name):
        try:
            return "demo:" + demo_quant(name)
        except SpecviewError:
            return name.lower()
    return os.path.normpath(os.path.expanduser(name))


def same_target(row: TargetMap, target: str, model: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether ``row`` maps the run's target: (same, how) where how is "file facts" or "name"."""
    facts = row.model or {}
    if isinstance(model, Mapping) and facts.get("file") and model.get("file"):
        for k in IDENTITY_KEYS:
            if k in facts and k in model and facts[k] is not None and model[k] is not None and facts[k] != model[k]:
                return False, "file facts"
        return True, "file facts"
    if _norm_name(row.target) == _norm_name(target):
        return True, "name"
    path = facts.get("path")
    if isinstance(path, str) and path and _norm_name(path) == _norm_name(target):
        return True, "name"
    return False, "name"


def settings_differences(run: EngineSettings, mapped: EngineSettings) -> list[str]:
    """The kernel-deciding settings (``context_key`` but the threads) that differ ('flash_attn on here, off in the
    map')."""
    a, b = run.context_key, mapped.context_key
    return [f"{name} {getattr(a, name)!s} here, {getattr(b, name)!s} in the map"
            for name in KERNEL_SETTINGS if getattr(a, name) != getattr(b, name)
            and not (name == "rollback" and UNRECORDED_ROLLBACK in (getattr(a, name), getattr(b, name)))]


def _threads(used: Any, setting: int) -> int | None:
    if isinstance(used, int) and not isinstance(used, bool) and used > 0:
        return used
    return setting if setting > 0 else None


def environment_differences(map_env: Mapping[str, Any] | None, run_env: Mapping[str, Any] | None) -> list[str]:
    """What differs between the machine and build the map was made on and the run's ('cpu: A (map) vs B (run)')."""
    if not isinstance(map_env, Mapping) or not isinstance(run_env, Mapping):
        return []
    out = []
    for k in ENV_KEYS:
        if k in map_env and k in run_env and map_env[k] != run_env[k]:
            out.append(f"{k}: {_short(map_env[k])} (map) vs {_short(run_env[k])} (run)")
    return out


def _short(v: Any, n: int = 80) -> str:
    if isinstance(v, list) and all(isinstance(x, Mapping) for x in v):
        v = ", ".join(str(x.get("description") or x.get("name") or "?") for x in v)
    s = str(v)
    return s if len(s) <= n else s[:n] + "…"


def reach_of(row: TargetMap) -> int | None:
    """The furthest KV position the row's measured tokens reached: its longest prompt plus the positions."""
    if not row.prompts:
        return None
    return max(len(p.prompt_tokens) + p.positions for p in row.prompts)


def _not_covered(p: KernelPrediction, who: str, missing: str) -> KernelPrediction:
    p.missing = [missing]
    p.reason = f"the map does not cover {who}: {missing}"
    return p


def _matching_row(p: KernelPrediction, km: KernelMap, target: str, settings: EngineSettings,
                  model: Mapping[str, Any] | None, backend: str | None, run_threads: int | None,
                  who: str) -> tuple[TargetMap, str] | None:
    """The map row of this run's engine, target, settings and thread count, and how the target matched ("file
    facts" or "name"); None with ``p`` saying what the map lacks."""
    if backend is not None and backend != km.backend:
        _not_covered(p, who, f"the map was made on the {km.backend} engine, this run used {backend}")
        return None
    rows = [(r, how) for r in km.targets for ok, how in [same_target(r, target, model)] if ok]
    if not rows:
        have = ", ".join(t.label for t in km.targets) or "no rows"
        _not_covered(p, who, f"no row for {target} (the map has {have})")
        return None
    by_settings = [(r, how) for r, how in rows if not settings_differences(settings, r.settings)]
    if not by_settings:
        nearest = min(rows, key=lambda rh: len(settings_differences(settings, rh[0].settings)))[0]
        diffs = settings_differences(settings, nearest.settings)
        _not_covered(p, who, f"{target} was not mapped under these settings ({'; '.join(diffs)})")
        return None
    if run_threads is None:
        return by_settings[0]
    exact = [(r, h) for r, h in by_settings if _threads(r.threads_used, r.settings.threads) == run_threads]
    same = exact or [(r, h) for r, h in by_settings if _threads(r.threads_used, r.settings.threads) is None]
    if not same:
        mapped = sorted({_threads(r.threads_used, r.settings.threads) for r, _ in by_settings})
        p.row = by_settings[0][0].label
        _not_covered(p, who, f"the map ran {target} with {', '.join(map(str, mapped))} thread(s), this run with "
                             f"{run_threads}: the width-1 control and the kernels' thread split are per thread count")
        return None
    return same[0]


def _cite_row(p: KernelPrediction, km: KernelMap, row: TargetMap, how: str, target: str, run_threads: int | None,
              environment: Mapping[str, Any] | None) -> None:
    """The matched row's facts on ``p``, with a caveat for each way the match is weaker than it looks."""
    p.row = row.label
    p.safe_n_max = row.safe_n_max()
    p.map_reach = reach_of(row)
    row_threads = _threads(row.threads_used, row.settings.threads)
    if how == "name":
        p.caveats.append(f"{target} matched the map row {row.label} by name only: no file facts to compare")
    if run_threads is None or row_threads is None:
        p.caveats.append("the thread count was not recorded on both sides, so it was not compared")
    env = environment_differences(km.environment, environment)
    if env:
        p.caveats.append("the map was made on another machine or build (" + "; ".join(env) + "): its kernels may "
                         "not be this run's")


def _judge_widths(p: KernelPrediction, row: TargetMap, widths: list[int], n_max: int, serial: bool,
                  reach: int | None, who: str) -> KernelPrediction:
    """The status the row's width-1 control and its widths in range give."""
    w1 = row.widths.get(1)
    if w1 is None or w1.rows == 0:
        return _not_covered(p, who, f"width 1, the map's control, was not mapped for {row.label}")
    if not row.deterministic:
        p.status = NOT_DETERMINISTIC
        p.evidence = row.evidence([1])
        p.reason = (f"the map's width-1 control failed for {row.label} (the same single-token pass gave other bits "
                    "after a rollback): it proves nothing for this target")
        return p
    measured = [w for w in widths if w in row.widths and row.widths[w].rows > 0]
    absent = [w for w in widths if w not in measured]
    differ = [w for w in measured if not row.widths[w].bit_identical]
    p.evidence = row.evidence(measured)
    span = "width 1 (serial verify: every verify row is its own single-token pass)" if serial else \
        f"widths {ranges(widths)} (n_max {n_max})"
    if differ:
        return _kernels_differ(p, row, differ[0], span)
    if absent:
        mapped = sorted(row.widths)
        were = "width {} was".format(absent[0]) if len(absent) == 1 else f"widths {ranges(absent)} were"
        p.missing = [f"{were} not mapped for {row.label} (the map has widths {ranges(mapped)})"]
        p.reason = f"the map does not cover {span} of {who}: {p.missing[0]}"
        return p
    p.status = PROVEN
    p.reach = reach
    if reach is not None and p.map_reach is not None and reach > p.map_reach:
        p.caveats.append(f"{REACH_CAVEAT} {reach}, the map measured up to {p.map_reach}: beyond it the "
                         "claim assumes the kernels do not change with the context length, which they can")
    p.reason = (f"{row.label}: {span} bit-identical to single-token passes ({p.evidence}); batched numerics cannot "
                "make the arms differ")
    return p


def _kernels_differ(p: KernelPrediction, row: TargetMap, w: int, span: str) -> KernelPrediction:
    """``kernels-differ`` at width ``w``, the first in range that is not bit-identical, with its numbers."""
    st = row.widths[w]
    p.status = DIFFER
    p.first_differing, p.identical_share = w, st.identical_share
    p.max_delta = st.max_delta if st.max_delta == st.max_delta else None
    p.flips = st.flips
    stopped = " (measured up to its first difference)" if st.stopped else ""
    p.reason = (f"the map finds width {w} differing from single-token passes for {row.label}: "
                f"{100 * st.identical_share:.1f}% of its {st.rows} rows bit-identical{stopped}, max |Δ| "
                f"{_num(p.max_delta)} logits, {st.flips} argmax flips; a fork at {span} is what the kernels "
                "predict is possible")
    return p


def predict(
    kmap: KernelMap | Mapping[str, Any],
    target: str,
    settings: EngineSettings,
    n_max: int,
    *,
    model: Mapping[str, Any] | None = None,
    threads_used: int | None = None,
    backend: str | None = None,
    environment: Mapping[str, Any] | None = None,
    reach: int | None = None,
    serial: bool = False,
    map_file: str | os.PathLike[str] | None = None,
) -> KernelPrediction:
    """What the kernel map predicts for a run of ``target`` under ``settings`` drafting up to ``n_max`` tokens.

    ``model`` is the run's target file facts (a trace's ``models.target``), which
    decide the target's identity when the map row has them too; ``threads_used``
    the thread count the run's contexts used (default: ``settings.threads`` when
    it is not 0); ``backend`` the run's engine; ``environment`` the run's
    (differences from the map's become caveats); ``reach`` the furthest KV
    position the run occupied (prompt plus generated tokens); ``serial`` a run
    whose verify rows were each computed as single-token passes (width 1 only).
    """
    km = as_kernel_map(kmap, source=str(map_file) if map_file is not None else None)
    settings = Runner.as_decided(settings, backend=backend or km.backend)  # as the map's rows were recorded: decided
    n_max = max(0, int(n_max))
    widths = [1] if serial else list(range(1, n_max + 2))
    p = KernelPrediction(status=NOT_COVERED, target=target, n_max=n_max, widths=widths,
                         settings=settings_label(settings), map_file=str(map_file) if map_file is not None else None)
    who = f"{target}" + (f" [{p.settings}]" if p.settings else "")
    run_threads = _threads(threads_used, settings.threads)
    matched = _matching_row(p, km, target, settings, model, backend, run_threads, who)
    if matched is None:
        return p
    row, how = matched
    _cite_row(p, km, row, how, target, run_threads, environment)
    return _judge_widths(p, row, widths, n_max, serial, reach, who)


def predict_config(kmap: KernelMap | Mapping[str, Any], cfg: RunConfig, *, model: Mapping[str, Any] | None = None,
                   threads_used: int | None = None, environment: Mapping[str, Any] | None = None,
                   reach: int | None = None, map_file: str | os.PathLike[str] | None = None) -> KernelPrediction:
    """:func:`predict` for a run's settings: its target, engine settings, engine, draft width and serial verify.

    The draft width is ``n_max`` for a draft model, the n-gram draft size for ``ngram-simple`` and 0 for ``none``
    (:attr:`RunConfig.draft_width`).
    """
    return predict(kmap, cfg.target, cfg.engine, cfg.draft_width, model=model, threads_used=threads_used,
                   backend=cfg.backend, environment=environment, reach=reach, serial=cfg.serial_verify,
                   map_file=map_file)


def predict_trace(kmap: KernelMap | Mapping[str, Any], trace: Any, *,
                  map_file: str | os.PathLike[str] | None = None) -> KernelPrediction:
    """:func:`predict` for a finished run, from its trace (its settings, target file facts, threads, environment).

    A trace whose settings do not read back as a valid run gets ``not-covered``, saying so.
    """
    raw = trace.config if isinstance(trace.config, dict) else {}
    try:
        cfg = RunConfig.from_dict(raw)
    except SpecviewError as exc:
        return KernelPrediction(status=NOT_COVERED, target=str(raw.get("target", "?")), n_max=0, widths=[],
                                missing=[f"the trace's settings are not a valid run ({exc})"],
                                map_file=str(map_file) if map_file is not None else None,
                                reason="the trace's settings are not a valid run, so nothing can be matched")
    models = trace.models if isinstance(trace.models, dict) else {}
    model = models.get("target") if isinstance(models.get("target"), dict) else None
    tokens = trace.prompt.get("tokens") if isinstance(trace.prompt, dict) else None
    n_prompt = len(tokens) if isinstance(tokens, list) else 0
    reach = n_prompt + max(len(trace.vanilla.tokens), len(trace.speculative.tokens))
    used = raw.get("threads_used")
    return predict_config(kmap, cfg, model=model, threads_used=used if isinstance(used, int) else None,
                          environment=trace.environment if isinstance(trace.environment, dict) else None,
                          reach=reach, map_file=map_file)


# -- contradictions ------------------------------------------------------------------------
def likely_causes(pred: KernelPrediction, *, fork_position: int | None = None) -> str:
    """Which a contradiction could be, the likelier first: a state bug, or a shape the map did not measure."""
    shapes = []
    if fork_position is not None and pred.map_reach is not None and fork_position > pred.map_reach:
        shapes.append(f"the fork is at KV position {fork_position}, beyond the {pred.map_reach} the map measured, "
                      "where the kernels can change with the context")
    if any(c.startswith("the map was made on another machine") for c in pred.caveats):
        shapes.append("the map was made on another machine or build")
    if shapes:
        return f"A shape the map did not measure is the likelier cause ({'; '.join(shapes)}), else a state bug."
    return ("The fork is within the widths and positions the map measured, so a state bug in the loop or its cache "
            "(a rollback that keeps a rejected draft, a lost KV entry) is the likelier cause, else a shape the map "
            "did not measure (this prompt's own KV state).")


def contradiction_text(pred: KernelPrediction, *, where: str, fork: int | None, pieces: tuple[Any, Any] | None = None,
                       fork_position: int | None = None) -> str:
    """The loud sentences for a run the map proves lossless that forked anyway: what, which it could be, what to run."""
    toks = ""
    if pieces is not None:
        a, b = ("(end of output)" if x is None else repr(x) for x in pieces)
        toks = f" ({a} vs {b})"
    map_name = Path(pred.map_file).name if pred.map_file else "the kernel map"
    n = pred.safe_n_max if pred.safe_n_max is not None else pred.n_max
    return (f"CONTRADICTION: {where} forks at token {fork if fork is not None else '?'}{toks} although {map_name} "
            f"proves n_max ≤ {n} lossless for {pred.row or pred.target}: a state bug or a shape the map did not "
            f"measure. {likely_causes(pred, fork_position=fork_position)} To tell which, {SERIAL_CHECK}: identical "
            "to vanilla means a shape the map did not measure, still different means a state bug.")


def citation(kmap: KernelMap, file: str | os.PathLike[str]) -> dict[str, Any]:
    """What a matrix file records of the map it cites (enough to read its claims without the file)."""
    return {
        "file": str(file),
        "schema": "specview.kernels/1",
        "backend": kmap.backend,
        "widths": list(kmap.widths),
        "positions": kmap.positions,
        "prompts": [p.name for p in kmap.prompts],
        "targets": [{"label": t.label, "target": t.target, "deterministic": t.deterministic,
                     "safe_widths": t.safe_widths(), "safe_n_max": t.safe_n_max(), "threads_used": t.threads_used}
                    for t in kmap.targets],
        "environment": {k: kmap.environment[k] for k in ENV_KEYS if k in kmap.environment},
    }


def citation_text(cite: Mapping[str, Any]) -> str:
    """One line naming a cited map: its file, rows, widths, prompts and build."""
    rows = []
    for t in cite.get("targets") or []:
        if not isinstance(t, Mapping):
            continue
        n = t.get("safe_n_max")
        if t.get("deterministic") is False:
            rows.append(f"{t.get('label')}: not deterministic")
        else:
            proven = f"n_max ≤ {n} proven" if isinstance(n, int) else "none proven"
            rows.append(f"{t.get('label')}: {proven}")
    ws = [w for w in cite.get("widths") or [] if isinstance(w, int) and not isinstance(w, bool)]
    prompts = [p for p in cite.get("prompts") or [] if isinstance(p, str)]
    env = cite.get("environment") if isinstance(cite.get("environment"), Mapping) else {}
    build = ", ".join(f"{k} {_short(env[k], 40)}" for k in ("backend", "llama_cpp_python", "mlx", "cpu") if k in env)
    return (f"kernel map {cite.get('file')}: widths {ranges(ws) or '?'}, {cite.get('positions')} positions of "
            f"{', '.join(prompts) or '?'}" + (f"; {build}" if build else "") + (f"; {'; '.join(rows)}" if rows else ""))


def statuses(preds: Iterable[KernelPrediction]) -> dict[str, int]:
    out = {s: 0 for s in STATUSES}
    for p in preds:
        out[p.status] = out.get(p.status, 0) + 1
    return out


__all__ = ["DIFFER", "ENV_KEYS", "IDENTITY_KEYS", "KERNEL_SETTINGS", "KernelPrediction", "NOT_COVERED",
           "NOT_DETERMINISTIC", "PROVEN", "REACH_CAVEAT", "SERIAL_CHECK", "STATUSES", "STATUS_WORDS",
           "as_kernel_map", "kernel_map_from_json", "citation", "citation_text", "contradiction_text", "environment_differences",
           "likely_causes", "load_kernel_map", "predict", "predict_config", "predict_trace", "reach_of", "same_target",
           "settings_differences", "statuses"]
