"""Flags and helpers shared by the commands that run models (``run``, ``matrix``, ``kernels`` ...).

The flags of every setting are generated from its declaration in
:mod:`specview.core.config`: its flag names, default, range, choices and help
text are written there once.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, Field, replace
from typing import Any, Iterable

from ..core.config import EngineSettings, RunConfig, declared, default_of, typed_default
from ..core.errors import ConfigError, SpecviewError
from ..core.prompts import MAX_PROMPT_BYTES, read_text_file
from ..core.userfiles import megabytes

GROUP_TITLES = {
    "models": "models",
    "speculation": "speculation (llama.cpp names)",
    "prompt": "prompt and stopping",
    "engine": "engine (llama.cpp names)",
}
#: settings whose flags a command builds itself (they need more than one value's parsing)
SPECIAL = {"prompt", "prompt_tokens", "backend"}


def _value_type(f: Field) -> Any:
    d = typed_default(f)
    if isinstance(d, bool):
        return bool
    if isinstance(d, float) or str(f.type).startswith("float"):
        return float
    if isinstance(d, int):
        return int
    return str


TRUE_WORDS = ("true", "on", "yes", "1")
FALSE_WORDS = ("false", "off", "no", "0")


def _bool_word(text: str) -> bool:
    """``true``/``on``/``yes``/``1`` or ``false``/``off``/``no``/``0`` (a matrix's list of a true/false setting)."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(text)


def _csv(kind: type, name: str):
    conv = _bool_word if kind is bool else kind

    def parse(text: str) -> list[Any]:
        out = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(conv(part))
            except ValueError:
                what = "true or false" if kind is bool else f"a valid {kind.__name__}"
                raise argparse.ArgumentTypeError(f"{part!r} is not {what}") from None
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
                if kind is bool:  # the flag alone means true; a list (true,false) is an axis
                    kw.update(nargs="?", const=[True], help=kw["help"] + " (true, false)")
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
            if meta.get("off_flags"):
                off = f"{meta['flags'][-1]} off"
                if matrix and meta.get("axis"):
                    g.add_argument(*meta["off_flags"], dest=f.name, action="append_const", const=[False],
                                   help=f"{off} (the same as {meta['flags'][-1]} false)")
                else:
                    g.add_argument(*meta["off_flags"], dest=f.name, action="store_false", default=kw["default"],
                                   help=f"{off}, explicitly (wins over a default this machine would pick)")
    return groups


#: settings whose value is itself a list of flags (``--server-args "--no-repack"``)
FLAG_VALUED = ("server_args",)


def flags_taking_flags() -> tuple[str, ...]:
    """The command-line flags whose value may start with a dash (their settings' values are other programs' flags)."""
    out: list[str] = []
    for cls in (RunConfig, EngineSettings):
        for f in declared(cls):
            if f.name in FLAG_VALUED:
                out.extend(f.metadata.get("flags") or ())
    return tuple(out)


def join_dash_values(argv: Iterable[str], flags: Iterable[str] | None = None) -> list[str]:
    """``[..., "--server-args", "--no-repack", ...]`` -> ``[..., "--server-args=--no-repack", ...]``.

    argparse takes a value that starts with a dash for the next option (and
    refuses the flag: "expected one argument"); a flag whose value is a list of
    another program's flags always takes the next word as its value, so it is
    joined to it before parsing.  Words after ``--`` are left alone.
    """
    names = set(flags_taking_flags() if flags is None else flags)
    argv = list(argv)
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out.extend(argv[i:])
            break
        if word in names and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{word}={argv[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


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
    """The engine settings the flags give; what they leave unset the engine decides for this machine when it
    runs (:mod:`specview.core.resolve`)."""
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
    """The text of ``--prompt-file``: a file, a pipe (``<(...)``), or standard input for ``-``, read with the
    bound every prompt file has."""
    if str(path) == "-":
        raw = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
        if len(raw) > MAX_PROMPT_BYTES:
            raise SpecviewError(f"--prompt-file -: more than {megabytes(MAX_PROMPT_BYTES)} on standard input; no "
                                "prompt is that large")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecviewError(f"--prompt-file -: standard input is not UTF-8 text (byte {exc.start:,})") from None
    try:
        return read_text_file(path, "prompt file", pipes=True)
    except SpecviewError as exc:
        raise SpecviewError(f"--prompt-file {exc}") from None


def check_output(path: str | None, flag: str = "-o") -> None:
    """Refuse an output file that could not be written before the work it would hold is done (a run of minutes
    lost at its end): ``flag`` names where it came from."""
    from ..core.jsonfile import check_writable

    if path:
        try:
            check_writable(path)
        except SpecviewError as exc:
            raise SpecviewError(f"{flag} {exc}") from None


class Progress:
    """Status lines on stderr, so stdout stays clean for the summary."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"specview: {msg}", file=sys.stderr, flush=True)
