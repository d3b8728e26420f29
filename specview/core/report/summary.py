"""A run's summary, versioned and checksummed, for one table across machines (``specview compare DIR``).

A summary (``specview.summary/1``) holds what a cross-machine table compares: the machine and chip, the
backend and its devices, the build, each model's file and SHA-256, the prompt's fingerprint, the settings, the
verdict and where the arms fork, the token fingerprints of both arms, and the rates (acceptance, speed, the
near-tie density).  :func:`seal` adds ``checksum``, the SHA-256 of the summary's canonical JSON, so a summary
edited by hand no longer matches it.

A trace carries its summary as its top-level ``summary`` key (``specview run --json``); a fork card (PNG)
carries it as an ``iTXt`` chunk keyed ``specview-summary`` (:func:`png_with_summary`).  A trace's summary is
also checked against the trace itself: a trace whose tokens or settings were changed after it was sealed is
edited too, even if its summary was left alone.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from typing import Any

from .facts import obj, verdict_of

SCHEMA = "specview.summary/1"
#: the key a trace keeps its summary under, and the PNG chunk keyword a card keeps it under
TRACE_KEY, PNG_KEY = "summary", "specview-summary"
#: the parts of a summary a trace's own content gives again (compared when a trace carries its summary)
CONTENT_KEYS = ("models", "prompt", "settings", "verdict", "first_mismatch", "tokens", "rates")
SETTING_KEYS = ("spec_type", "n_max", "n_min", "p_min", "max_tokens", "serial_verify", "ignore_eos")
ENGINE_KEYS = ("n_batch", "n_ubatch", "flash_attn", "kv_type", "gpu_layers", "no_repack", "threads")


def _sha(data: bytes, n: int | None = None) -> str:
    h = hashlib.sha256(data).hexdigest()
    return h if n is None else h[:n]


def canonical(d: Any) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def tokens_fingerprint(tokens: list[int]) -> str:
    """A short SHA-256 of a token list: equal lists, equal fingerprints, on any machine."""
    return _sha(",".join(str(int(t)) for t in tokens).encode(), 16)


def _r(x: Any, nd: int = 4) -> Any:
    return round(float(x), nd) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _models(trace: Any) -> dict[str, Any]:
    block = obj(obj(trace.config).get("models"))
    out = {}
    for role in ("target", "draft"):
        m, rec = obj(trace.models.get(role)), obj(block.get(role))
        if not m and not rec:
            continue
        out[role] = {"file": m.get("file"), "quantization": m.get("quantization"),
                     "size": m.get("file_size", rec.get("size")), "sha256": rec.get("sha256") or m.get("sha256")}
    return out


def _devices(env: dict[str, Any]) -> list[str]:
    out = []
    for d in env.get("ggml_devices") or []:
        d = obj(d)
        out.append(f"{d.get('name')}: {d.get('description') or d.get('type')}")
    return out


def _chip(env: dict[str, Any], cfg: dict[str, Any]) -> str:
    """What computed the run: the GPU device(s) layers went to, else the CPU."""
    gpu_layers = obj(cfg.get("engine")).get("gpu_layers")
    gpus = [obj(d) for d in env.get("ggml_devices") or [] if obj(d).get("type") in ("gpu", "igpu")]
    if gpus and gpu_layers not in (0, None):
        return ", ".join(str(d.get("description") or d.get("name")) for d in gpus)
    return str(env.get("cpu") or env.get("machine") or "unknown")


def _rates(trace: Any) -> dict[str, Any]:
    v, s = trace.vanilla, trace.speculative
    out = {"drafted": s.n_drafted, "accepted": s.n_accepted, "acceptance_rate": _r(s.acceptance_rate),
           "mean_accepted": _r(s.mean_accepted), "vanilla_tok_s": _r(v.tokens_per_s, 2),
           "speculative_tok_s": _r(s.tokens_per_s, 2),
           "speedup": _r(s.tokens_per_s / v.tokens_per_s, 3) if v.tokens_per_s > 0 else None}
    try:
        from ..diagnose.ties import tie_density

        ties = tie_density(trace)
    except Exception:  # noqa: BLE001 - a trace the density cannot read has no near-tie figures
        ties = None
    if isinstance(ties, dict):
        out["near_tie"] = {"positions": ties.get("positions"), "flips": ties.get("flips"),
                           "bands": {b["name"]: [b["in_band"], b["flipped"]] for b in ties.get("bands") or []
                                     if not b.get("calibrated")}}
    return out


def summary_of(trace: Any) -> dict[str, Any]:
    """The summary of ``trace``, not sealed."""
    cfg, env = obj(trace.config), obj(trace.environment)
    eng = obj(cfg.get("engine"))
    setup = obj(env.get("setup"))
    toks = [int(t) for t in obj(trace.prompt).get("tokens") or []]
    fm = trace.comparison.first_mismatch
    build = {k: env.get(k) for k in ("specview", "llama_cpp_python", "llama_cpp_vendored_commit", "ggml_version",
                                     "ggml_commit", "compiler") if env.get(k) is not None}
    server = obj(obj(env.get("llama_server")) or obj(env.get("server")))
    if server.get("version"):
        build["llama_server"] = server["version"]
    settings = {k: cfg.get(k) for k in SETTING_KEYS if k in cfg}
    settings.update({k: eng.get(k) for k in ENGINE_KEYS if k in eng})
    if cfg.get("threads_used") is not None:
        settings["threads"] = cfg["threads_used"]
    return {
        "schema": SCHEMA,
        "machine": {"os": env.get("os"), "arch": env.get("machine"), "cpu": env.get("cpu"),
                    "cpu_features": setup.get("machine.cpu_features")},
        "chip": _chip(env, cfg),
        "backend": {"engine": cfg.get("backend") or "llama.cpp", "devices": _devices(env),
                    "ggml_backends": env.get("ggml_backends")},
        "build": build,
        "models": _models(trace),
        "prompt": {"tokens": len(toks), "sha256": tokens_fingerprint(toks)},
        "settings": settings,
        "verdict": verdict_of(trace),
        "first_mismatch": None if fm is None else fm.index,
        "tokens": {"vanilla": len(trace.vanilla.tokens), "speculative": len(trace.speculative.tokens),
                   "vanilla_sha256": tokens_fingerprint(trace.vanilla.tokens),
                   "speculative_sha256": tokens_fingerprint(trace.speculative.tokens)},
        "rates": _rates(trace),
        "created": env.get("created"),
    }


def checksum(summary: dict[str, Any]) -> str:
    return "sha256:" + _sha(canonical({k: v for k, v in summary.items() if k != "checksum"}))


def seal(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with its ``checksum``."""
    out = {k: v for k, v in summary.items() if k != "checksum"}
    out["checksum"] = checksum(out)
    return out


def sealed_summary(trace: Any) -> dict[str, Any]:
    """The sealed summary of ``trace`` as its saved file gives it back: the file rounds the logits (and so the
    margins the near-tie counts read), and a summary must say what a reader of the file recomputes."""
    from ..errors import SpecviewError
    from ..trace import Trace

    try:
        saved = Trace.from_json(json.loads(trace.dumps()), source="<the trace being sealed>")
    except SpecviewError:  # a trace its own reader refuses: seal what it holds (the run is worth more)
        saved = trace
    return seal(summary_of(saved))


def check(summary: Any, trace: Any = None) -> tuple[str, str | None]:
    """("verified" | "edited" | "unsealed", why): whether a summary still matches its checksum and, given the trace
    that carries it, whether it still says what the trace says."""
    if not isinstance(summary, dict):
        return "unsealed", "no summary"
    if summary.get("schema") != SCHEMA:
        return "unsealed", f"summary schema {summary.get('schema')!r} is not {SCHEMA!r}"
    if not isinstance(summary.get("checksum"), str):
        return "unsealed", "no checksum"
    try:
        if checksum(summary) != summary["checksum"]:
            return "edited", "its checksum no longer matches its content"
    except (TypeError, ValueError):
        return "edited", "its content is not plain JSON any more"
    if trace is not None:
        again = summary_of(trace)
        changed = [k for k in CONTENT_KEYS if k in summary and canonical(summary[k]) != canonical(again[k])]
        if changed:
            return "edited", f"the trace no longer gives its {', '.join(changed)}"
    return "verified", None


# -- a fork card's PNG carries it ---------------------------------------------------------------------------
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of each chunk of a PNG; ValueError when it is not one."""
    if not png.startswith(PNG_MAGIC):
        raise ValueError("not a PNG file")
    out, i = [], len(PNG_MAGIC)
    while i + 8 <= len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        if i + 12 + n > len(png):
            raise ValueError("a PNG chunk runs past the end of the file")
        out.append((kind, png[i + 8:i + 8 + n]))
        i += 12 + n
        if kind == b"IEND":
            break
    return out


def png_with_summary(png: bytes, summary: dict[str, Any]) -> bytes:
    """The PNG with ``summary`` in an ``iTXt`` chunk (keyword :data:`PNG_KEY`, uncompressed UTF-8) before IEND;
    a summary it held before is replaced."""
    chunks = [(k, d) for k, d in png_chunks(png) if not (k == b"iTXt" and d.startswith(PNG_KEY.encode() + b"\0"))]
    data = PNG_KEY.encode() + b"\0\0\0\0\0" + json.dumps(summary, ensure_ascii=False, sort_keys=True).encode()
    body = [c for c in chunks if c[0] != b"IEND"]
    return PNG_MAGIC + b"".join(_chunk(k, d) for k, d in [*body, (b"iTXt", data), (b"IEND", b"")])


def png_summary(png: bytes) -> dict[str, Any] | None:
    """The summary a card carries, or None (a PNG without one); ValueError for a broken chunk."""
    prefix = PNG_KEY.encode() + b"\0"
    for kind, data in png_chunks(png):
        if kind == b"iTXt" and data.startswith(prefix):
            rest = data[len(prefix):]
            compressed = rest[:1] == b"\1"
            rest = rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            d = json.loads(zlib.decompress(text) if compressed else text)
            return d if isinstance(d, dict) else None
    return None


__all__ = ["CONTENT_KEYS", "PNG_KEY", "SCHEMA", "TRACE_KEY", "check", "checksum", "png_summary",
           "png_with_summary", "seal", "sealed_summary", "summary_of", "tokens_fingerprint"]
