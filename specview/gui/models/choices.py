"""Model choices for the pickers: demo names, the quantizations of one model a user has,
and which missing ones can be derived from a higher-precision copy.

An engine says what a model is for it (``Backend.model_kind``): a GGUF file
("gguf", quantized with llama.cpp's quantizer) or an MLX model folder ("folder",
converted with mlx-lm).  Plain file-system logic with no Qt, so it is easy to test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...core.paths import cache_dir
from ...core.registry import backend_for_models

# higher precision first; a file can be derived from any file ranked above it
PRECISION_ORDER = ("F32", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M",
                   "Q4_K_S", "Q4_1", "Q4_0", "IQ4_XS", "IQ4_NL", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
SOURCE_QUANTS = ("F32", "BF16", "F16", "Q8_0")
DERIVABLE = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
DEMO_CHOICES = tuple(f"demo:{q}" for q in ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0", "BF16", "F32"))

_KNOWN = sorted(set(PRECISION_ORDER) | {"Q2_K_S", "IQ2_XXS", "IQ2_XS", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ3_S",
                                        "IQ3_M", "IQ2_S", "IQ2_M", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4_MOE"},
                key=len, reverse=True)
_QUANT_RE = re.compile(r"(?i)(?<![A-Za-z0-9])(" + "|".join(_KNOWN) + r")(?![A-Za-z0-9])")


def quant_of(path: str | os.PathLike[str]) -> str | None:
    """The quantization named in a GGUF file name (``Model.Q4_K_M.gguf`` -> ``Q4_K_M``), or None."""
    hits = _QUANT_RE.findall(Path(path).name)
    return hits[-1].upper() if hits else None


def family_of(path: str | os.PathLike[str]) -> str:
    """The file name with its quantization and extension removed, normalised: one model's files share it."""
    stem = Path(path).name
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    stem = _QUANT_RE.sub("", stem)
    return re.sub(r"[-_. ]+", "-", stem).strip("-").lower()


def rank(quant: str | None) -> int:
    try:
        return PRECISION_ORDER.index(quant or "")
    except ValueError:
        return len(PRECISION_ORDER)


@dataclass(frozen=True)
class QuantChoice:
    quant: str
    path: str  # existing file, or where a derived file will be written
    exists: bool
    source: str | None = None  # for a file to derive: the file it is derived from

    @property
    def label(self) -> str:
        if self.exists:
            return f"{self.quant}  ({Path(self.path).name})"
        return f"{self.quant}  (derive from {quant_of(self.source or '') or Path(self.source or '').name})"


def siblings(path: str | os.PathLike[str]) -> list[QuantChoice]:
    """Every quantization of the model at ``path`` (a .gguf file or a folder), plus derivable ones.

    For a folder, the model family with the most files is chosen.  Existing
    files come first in precision order, then the quantizations that can be
    derived from the highest-precision file present (F32, BF16, F16 or Q8_0).
    """
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    if not folder.is_dir():
        return []
    try:
        files = sorted(f for f in folder.iterdir() if f.is_file() and f.name.lower().endswith(".gguf"))
    except OSError:
        return []
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(family_of(f), []).append(f)
    if not groups:
        return []
    fam = family_of(p) if p.is_file() else max(groups, key=lambda k: len(groups[k]))
    members = groups.get(fam, [])
    out = [QuantChoice(quant_of(f) or f.stem, str(f), True) for f in members]
    out.sort(key=lambda c: (rank(c.quant), c.path))
    have = {c.quant for c in out}
    sources = [c for c in out if c.quant in SOURCE_QUANTS]
    if sources:
        src = sources[0]
        for q in DERIVABLE:
            if q not in have and rank(q) > rank(src.quant):
                out.append(QuantChoice(q, str(derived_path(Path(src.path), q)), False, src.path))
    return out


def derived_path(src: Path, quant: str) -> Path:
    """Where a quantization derived from ``src`` goes: next to it if that folder is writable, else the cache."""
    q = quant_of(src)
    name = src.name
    if q:
        idx = name.upper().rfind(q)
        name = name[:idx] + quant + name[idx + len(q):]
    else:
        name = f"{src.stem}.{quant}.gguf"
    if os.access(src.parent, os.W_OK):
        return src.parent / name
    return cache_dir() / "derived" / name


def mlx_siblings(folder: str | os.PathLike[str]) -> list[QuantChoice]:
    """The precisions of the MLX model in ``folder`` the user has, plus the 8- and 4-bit copies
    mlx-lm's conversion can derive from its unquantized folder (cached by specview)."""
    try:
        have, derivable = backend_for_models("folder").model_variants(str(folder))
    except Exception:  # noqa: BLE001 - not an MLX folder (yet), or no MLX here: no choices, the run will say why
        return []
    out = [QuantChoice(v.label + (" (derived)" if v.derived else ""), str(v.path), True) for v in have]
    out += [QuantChoice(d.label, "", False, source=str(d.source)) for d in derivable]
    return out


def variants(name: str, model_kind: str) -> list[QuantChoice]:
    """The quantizations of the model ``name`` to flip through (none for a demo name or a missing path)."""
    if not name or name.lower().startswith("demo"):
        return []
    p = Path(name).expanduser()
    if model_kind == "folder":
        return mlx_siblings(p) if p.is_dir() else []
    return siblings(p) if p.exists() else []


def derive(choice: QuantChoice, model_kind: str, progress: Callable[[str], None] | None = None) -> str:
    """Write the missing quantization ``choice`` from its source; return the path of the new model."""
    say = progress or (lambda msg: None)
    if choice.source is None:
        raise ValueError(f"{choice.quant}: nothing to derive it from")
    be = backend_for_models(model_kind)
    if model_kind == "folder":
        say(f"deriving {choice.quant} from {Path(choice.source).name} with mlx-lm's conversion")
        return be.derive_variant(choice.source, choice.quant, progress=say)
    say(f"deriving {choice.quant} from {Path(choice.source).name} -> {choice.path}")
    return be.derive_variant(choice.source, choice.quant, dest=choice.path, progress=say)
