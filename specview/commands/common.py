"""Flags and helpers shared by the commands that run models (``run``, ``matrix``, ``kernels`` ...).

The flags of every setting are generated from its declaration in
:mod:`specview.core.config`: its flag names, default, range, choices and help
text are written there once.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, Field, replace
from pathlib import Path
from typing import Any, Iterable

from ..core.config import EngineSettings, RunConfig, declared, default_of
from ..core.errors import ConfigError, SpecviewError

GROUP_TITLES = {
    "models": "models",
    "speculation": "speculation (llama.cpp names)",
    "prompt": "prompt and stopping",
    "engine": "engine (llama.cpp names)",
}
#: settings whose flags a command builds itself (they need more than one value's parsing)
SPECIAL = {"prompt", "prompt_tokens", "backend"}


def _value_type(f: Field) -> Any:
    d = default_of(f)
    if isinstance(d, bool):
        return bool
    if isinstance(d, float) or str(f.type).startswith("float"):
        return float
    if isinstance(d, int):
        return int
    return str


def _csv(kind: type, name: str):
    def parse(text: str) -> list[Any]:
        out = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{part!r} is not a valid {kind.__name__}") from None
        if not out:
            raise argparse.ArgumentTypeError("empty list")
        return out

    parse.__name__ = f"{name} list"
    return parse


def _help(f: Field, *, default: Any, shown_default: bool) -> str:
    h = f.metadata.get("help", "")
    choices = f.metadata.get("choices")
    if choices:
        h += f" ({', '.join(map(str, choices))})"
    if shown_default and default not in (None, "") and not isinstance(default, bool):
        h += f" (default {default})"
    return h


def add_setting_flags(p: argparse.ArgumentParser, *, matrix: bool = False,
                      skip: Iterable[str] = ()) -> dict[str, argparse._ArgumentGroup]:
    """Add a flag for every declared setting, grouped as declared.

    In a ``matrix`` parser every default is None ("not given", so a matrix file's
    value stands) and the axis settings take comma-separated lists, repeatable.
    """
    skip = set(skip) | SPECIAL
    groups: dict[str, argparse._ArgumentGroup] = {}
    for cls in (RunConfig, EngineSettings):
        for f in declared(cls):
            meta = f.metadata
            if f.name in skip or not meta.get("flags"):
                continue
            gname = meta.get("group") or "engine"
            g = groups.get(gname) or groups.setdefault(gname, p.add_argument_group(GROUP_TITLES.get(gname, gname)))
            default = default_of(f)
            kind = _value_type(f)
            if meta.get("cli_default", MISSING) is not MISSING:
                default = meta["cli_default"]
            kw: dict[str, Any] = {"dest": f.name}
            if meta.get("metavar"):
                kw["metavar"] = meta["metavar"]
            if matrix and meta.get("axis"):
                kw.update(action="append", type=_csv(kind, f.name), default=None, metavar="LIST",
                          help=_help(f, default=default, shown_default=True) + "; a comma-separated list is an axis")
            elif kind is bool:
                action = argparse.BooleanOptionalAction if default else "store_true"
                kw.update(action=action, default=None if matrix else default,
                          help=_help(f, default=default, shown_default=False))
                kw.pop("metavar", None)
            else:
                kw.update(type=kind, default=None if matrix else default,
                          help=_help(f, default=default, shown_default=True))
                if meta.get("choices") and kind is str:
                    kw["choices"] = list(meta["choices"])
            g.add_argument(*meta["flags"], **kw)
    return groups


def add_engine_choice(p: argparse.ArgumentParser, group: argparse._ArgumentGroup | None = None, *,
                      matrix: bool = False) -> None:
    from ..core.registry import backend_names

    g = group or p.add_argument_group(GROUP_TITLES["engine"])
    g.add_argument("--engine", dest="backend", default=None if matrix else "llama.cpp", choices=backend_names(),
                   help="inference engine (default llama.cpp in-process)")


def flag_of(name: str) -> str:
    """The long flag a user types for a declared setting (for error messages)."""
    for cls in (RunConfig, EngineSettings):
        for f in declared(cls):
            if f.name == name:
                longs = [x for x in f.metadata["flags"] if x.startswith("--")]
                return longs[0] if longs else f.metadata["flags"][0]
    return name


def given_settings(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s declared settings that the command line set (None means not given)."""
    out = {}
    for f in declared(cls):
        if f.name in SPECIAL or not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        if v is not None:
            out[f.name] = v
    return out


def engine_settings(args: argparse.Namespace, base: EngineSettings | None = None) -> EngineSettings:
    return replace(base or EngineSettings(), **given_settings(args, EngineSettings))


def cli_error(exc: ConfigError) -> SpecviewError:
    """A ConfigError reworded for the command line: the setting named by its flag."""
    if exc.setting:
        msg, flag = str(exc), flag_of(exc.setting)
        if msg.startswith((exc.setting + " ", exc.setting + ":")):  # "p_min must be ..." -> "--p-min must be ..."
            return SpecviewError(flag + msg[len(exc.setting):])
        return SpecviewError(f"{flag}: {msg}")
    return exc


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
