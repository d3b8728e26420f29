"""Flags shared by the commands that run models (``run``, ``matrix``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.engine import EngineSettings, SpecviewError


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (llama.cpp names)")
    g.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "mlx", "llama-server"],
                   help="inference engine (default: llama.cpp in-process)")
    g.add_argument("-c", "--n-ctx", "--ctx-size", dest="n_ctx", type=int, default=0,
                   help="context size; 0 sizes it to the run (default)")
    g.add_argument("-b", "--n-batch", "--batch-size", dest="n_batch", type=int, default=512,
                   help="logical batch size, also the prompt prefill chunk (default 512)")
    g.add_argument("-ub", "--n-ubatch", "--ubatch-size", dest="n_ubatch", type=int, default=512,
                   help="physical batch size (default 512)")
    g.add_argument("-fa", "--flash-attn", choices=["auto", "on", "off"], default="auto",
                   help="flash attention (default auto)")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=-1,
                   help="layers to offload to the GPU; -1 = all (default)")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads; 0 = all cores (default)")
    g.add_argument("--kv-type", "--cache-type", dest="kv_type", default="f16",
                   help="KV cache type for K and V: f16 (default), q8_0, f32, bf16, q4_0 ...")
    g.add_argument("--server-bin", default=None,
                   help="llama-server binary for --engine llama-server (default: $SPECVIEW_LLAMA_SERVER, then PATH, "
                   "then the copy scripts/build-llama-server.sh builds)")
    g.add_argument("--server-args", default="",
                   help="extra llama-server flags, passed through verbatim: --spec-* and draft flags (-ngld, -devd, "
                   "-ctkd ...) to the speculative server only, the rest to both")


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    for name in ("n_ctx", "threads"):
        if getattr(args, name) < 0:
            raise SpecviewError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(args, name)})")
    if args.n_batch < 1 or args.n_ubatch < 1:
        raise SpecviewError(f"--n-batch and --n-ubatch must be >= 1 (got {args.n_batch}, {args.n_ubatch})")
    return EngineSettings(
        n_ctx=args.n_ctx,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
        flash_attn=args.flash_attn,
        gpu_layers=args.gpu_layers,
        threads=args.threads,
        kv_type=args.kv_type,
    )


def parse_tokens(text: str) -> tuple[int, ...]:
    """``--tokens "1, 2 3"`` -> (1, 2, 3), with a clear error on anything else."""
    parts = [x for x in text.replace(",", " ").split() if x]
    try:
        toks = tuple(int(x) for x in parts)
    except ValueError as exc:
        raise SpecviewError(f"--tokens takes integer token ids separated by commas or spaces ({exc})") from exc
    if not toks:
        raise SpecviewError("--tokens is empty: give at least one token id")
    if any(t < 0 for t in toks):
        raise SpecviewError("--tokens: token ids must be >= 0")
    return toks


def read_prompt_file(path: str) -> str:
    p = Path(path).expanduser()
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecviewError(f"--prompt-file {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecviewError(f"--prompt-file {p}: cannot read it as UTF-8 text ({exc})") from None


class Progress:
    """Status lines on stderr, so stdout stays clean for the summary."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"specview: {msg}", file=sys.stderr, flush=True)
