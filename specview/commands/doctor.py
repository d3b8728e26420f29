"""``specview doctor``: what specview will run on, in plain words (or JSON)."""

from __future__ import annotations

import argparse
import json

from .common import engine_settings


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "doctor",
        help="say what specview will run on: engines, GPU backends, offload, llama-server, CPU",
        description="Check the setup specview will run on: the llama-cpp-python version and the ggml backends it "
        "was built with and sees, whether -ngl really offloads layers to a GPU (it loads the demo model to "
        "find out), whether mlx/mlx-lm are usable, which llama-server binary would be used with its version and "
        "spec types, and the CPU facts and thread count that change the numerics.",
        epilog="Exit status: 0 nothing wrong, 1 a warning or problem was found (e.g. a GPU was asked for and the "
        "build has none), 2 error.",
    )
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                   help="the GPU layers you intend to use; > 0 on a build without a GPU backend is a problem "
                   "(default: all layers, as specview run)")
    p.add_argument("--server-bin", dest="server_bin", default=None, help="the llama-server binary to check")
    from ..core.config import EngineSettings, declared

    for f in declared(EngineSettings):  # ggml's start-up knobs: doctor sees the devices a run with them would see
        if f.metadata.get("env"):
            kind = {"action": "store_true"} if isinstance(f.default, bool) else {"metavar": f.metadata["metavar"]}
            p.add_argument(*f.metadata["flags"], dest=f.name, default=None, help=f.metadata["help"], **kind)
    p.add_argument("--engine", dest="engines", action="append", default=None,
                   help="check only this engine (repeatable; default every engine)")
    p.add_argument("--quick", action="store_true", help="skip checks that load a model")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from ..core.doctor import format_facts, gather, worst

    settings = engine_settings(args)
    facts = gather(settings, engines=args.engines, deep=not args.quick)
    if args.json:
        print(json.dumps({"status": worst(facts), "facts": [f.to_json() for f in facts]}, indent=2, default=str))
    else:
        print(format_facts(facts))
        w = worst(facts)
        print()
        print({"ok": "All good.", "info": "All good.", "warn": "Something needs a look (WARN above).",
               "problem": "A problem was found (FAIL above)."}[w])
    return 0 if worst(facts) in ("ok", "info") else 1
