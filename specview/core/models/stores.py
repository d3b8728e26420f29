"""How each store lays out its models on disk: walkers that find candidate files, with the name each one gets.

A walker yields :class:`Found` (a path, its source, and either its own name
or the repository it belongs to, named once the repository's headers are
read) and appends a :class:`Problem` for each thing it cannot use.  Walkers
follow symlinks (the Hugging Face cache is made of them) but never enter a
folder twice, and never go deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .files import NotRegular, TooLarge, kind_of, not_regular_why, read_small
from .folder import is_model_folder
from .header import shard_of
from .info import Problem

MAX_DEPTH = 8
MAX_MANIFEST = 1 << 20
OLLAMA_REGISTRY, OLLAMA_NAMESPACE = "registry.ollama.ai", "library"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_DEMO_QUANT = re.compile(r"^SmolLM2-135M-Instruct\.([A-Z0-9_]+)\.gguf$")
_DEMO_DRAFTER = re.compile(r"^tiny-(eagle3|dflash|dspark)-v(\d+)\.for-SmolLM2-135M-Instruct\.gguf$")


@dataclass
class Found:
    """A model a walker found: ``name`` when the store names it, else ``group`` (the repository's name, which
    the model gets alone or with a ``:QUANT`` / ``:FILE`` selector) and ``rel`` (its path in the repository)."""

    path: Path
    source: str
    name: str | None = None
    group: str | None = None
    rel: str = ""
    aliases: tuple[str, ...] = ()
    order: int = 0


def _why(exc: OSError, *, folder: bool = False) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop (it links, through other links, back to itself)"
    if isinstance(exc, PermissionError):
        what = "cannot list this folder" if folder else "cannot be read"
        return f"{what}: permission denied ({exc.strerror or exc})"
    if isinstance(exc, FileNotFoundError):
        return "a broken symlink or a path that vanished (an interrupted download?)"
    return f"cannot be read ({exc.strerror or exc})"


def _enter(d: Path, seen: set[tuple[int, int]], problems: list[Problem], *,
           missing_ok: bool = False) -> list[os.DirEntry] | None:
    """The entries of folder ``d`` by name, or None (with a Problem) when it cannot be listed or was entered
    before through another path (a symlink loop: ``seen`` holds the folders entered)."""
    try:
        st = d.stat()
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError as exc:
        if not (missing_ok and isinstance(exc, FileNotFoundError)):
            problems.append(Problem(str(d), _why(exc, folder=True)))
        return None
    if (st.st_dev, st.st_ino) in seen:
        problems.append(Problem(str(d), "a symlink loop: this folder was reached before through another path"))
        return None
    seen.add((st.st_dev, st.st_ino))
    return entries


def walk(top: Path, problems: list[Problem], *, depth: int = MAX_DEPTH) -> Iterator[tuple[Path, str]]:
    """(path, "gguf" | "folder") for every GGUF file (first shard only) and model folder under ``top``."""
    seen: set[tuple[int, int]] = set()
    stack = [(top, 0)]
    while stack:
        d, level = stack.pop()
        entries = _enter(d, seen, problems)
        if entries is None:
            continue
        if is_model_folder({e.name for e in entries}):
            yield d, "folder"
        subdirs = []
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                if e.is_symlink():
                    os.stat(e.path)  # a dangling link or a loop fails here
                is_dir = e.is_dir()
            except OSError as exc:
                if e.name.lower().endswith(".gguf") or exc.errno == errno.ELOOP:
                    problems.append(Problem(e.path, _why(exc)))
                continue
            if is_dir:
                if level < depth:
                    subdirs.append(Path(e.path))
                continue
            low = e.name.lower()
            if not low.endswith(".gguf") or low.startswith("mmproj") or ".incomplete" in low:
                continue  # a vision projector is not a model to run; other files are not models
            what = _special(e)
            if what:
                problems.append(Problem(e.path, not_regular_why(what)))
                continue
            shard = shard_of(e.name)
            if shard is not None and shard[0] != 1:
                continue  # the first shard stands for a split model
            yield Path(e.path), "gguf"
        stack.extend((s, level + 1) for s in reversed(subdirs))


def _special(e: os.DirEntry) -> str | None:
    """What a folder entry is when it is a FIFO, socket or device (symlinks followed), else None."""
    try:
        return kind_of(e.stat().st_mode)
    except OSError:
        return None


def repo_walk(top: Path, source: str, prefix: str, problems: list[Problem], *, repo_depth: int) -> Iterator[Found]:
    """Models under a store whose first ``repo_depth`` folder levels name the repository (LM Studio's
    ``publisher/repo``): each is grouped as ``prefix + publisher/repo``."""
    for path, _kind in walk(top, problems):
        rel = path.relative_to(top)
        parts = rel.parts if path.is_dir() else rel.parts[:-1]
        repo = "/".join(parts[:repo_depth]) if parts else ""
        inner = Path(*rel.parts[len(parts[:repo_depth]):]) if rel.parts[len(parts[:repo_depth]):] else Path(".")
        if not repo:  # a file at the store's top: its own name
            yield Found(path, source, name=prefix + path.name)
            continue
        yield Found(path, source, group=prefix + repo, rel=inner.as_posix())


def lmstudio(top: Path, problems: list[Problem]) -> Iterator[Found]:
    """LM Studio: ``<models>/<publisher>/<repo>/<file>.gguf`` or an MLX folder ``<publisher>/<repo>/``."""
    yield from repo_walk(top, "lmstudio", "lmstudio:", problems, repo_depth=2)


def _read_small(path: Path, limit: int) -> bytes:
    """The bytes of a small file (a manifest, a ref): ValueError past ``limit``, NotRegular (an OSError whose
    strerror says what it is) for a FIFO, socket or device, which is never opened for reading."""
    try:
        return read_small(path, limit)
    except TooLarge:
        raise ValueError(f"more than {limit} bytes: not a manifest") from None


def _oserror(exc: OSError) -> str:
    return exc.strerror if isinstance(exc, NotRegular) else f"{type(exc).__name__}: {exc}"


def _hf_snapshot(repo_dir: Path, problems: list[Problem]) -> Path | None:
    snaps = repo_dir / "snapshots"
    try:
        ref = _read_small(repo_dir / "refs" / "main", 256).decode("ascii", "replace").strip()
        if ref and (snaps / ref).is_dir():
            return snaps / ref
    except NotRegular as exc:
        problems.append(Problem(str(repo_dir / "refs" / "main"), f"{exc.strerror} (the newest snapshot is used)"))
    except (OSError, ValueError):
        pass
    try:
        revs = [Path(e.path) for e in os.scandir(snaps) if e.is_dir()]
    except OSError as exc:
        problems.append(Problem(str(repo_dir), "no snapshots folder: an incomplete download" if isinstance(
            exc, FileNotFoundError) else _why(exc)))
        return None
    if not revs:
        problems.append(Problem(str(repo_dir), "no snapshot in it: an incomplete download"))
        return None
    return max(revs, key=lambda p: p.stat().st_mtime_ns)


def hf_hub(top: Path, problems: list[Problem], *, source: str = "hf", prefix: str = "hf:") -> Iterator[Found]:
    """The Hugging Face hub cache: ``models--org--repo/snapshots/<rev>/`` (the revision ``refs/main`` names,
    else the newest), its GGUF files and model folders, each grouped as ``hf:org/repo``."""
    try:
        repos = sorted((e for e in os.scandir(top) if e.name.startswith("models--")), key=lambda e: e.name)
    except OSError as exc:
        problems.append(Problem(str(top), _why(exc, folder=True)))
        return
    for e in repos:
        repo_id = "/".join(e.name.split("--")[1:])
        snap = _hf_snapshot(Path(e.path), problems)
        if snap is None:
            continue
        for path, _kind in walk(snap, problems):
            yield Found(path, source, group=prefix + repo_id, rel=path.relative_to(snap).as_posix())


def llama_cache(top: Path, problems: list[Problem]) -> Iterator[Found]:
    """llama.cpp's ``-hf`` download cache: ``manifest=org=repo=tag.json`` beside ``org_repo_<file>.gguf``
    (named ``llama.cpp:org/repo:tag``), other GGUF files by file name, and any hub-cache repositories."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError as exc:
        problems.append(Problem(str(top), _why(exc)))
        return
    claimed: set[str] = set()
    for e in entries:
        if not (e.name.startswith("manifest=") and e.name.endswith(".json")):
            continue
        bits = e.name[len("manifest="):-len(".json")].split("=")
        if len(bits) != 3:
            continue
        org, repo, tag = bits
        try:
            doc = json.loads(_read_small(Path(e.path), MAX_MANIFEST))
            rfile = doc["ggufFile"]["rfilename"]
            if not isinstance(rfile, str):
                raise TypeError("rfilename is not text")
        except OSError as exc:
            problems.append(Problem(e.path, f"not a llama.cpp download manifest ({_oserror(exc)})"))
            continue
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            problems.append(Problem(e.path, f"not a llama.cpp download manifest ({type(exc).__name__}: {exc})"))
            continue
        local = top / f"{org}_{repo}_{rfile}".replace("/", "_")
        what = _kind_at(local)
        if what:
            problems.append(Problem(e.path, f"names {rfile}, but {local.name} is " +
                                    ("not in the cache" if what == "missing" else not_regular_why(what))))
            continue
        claimed.add(local.name)
        name = f"llama.cpp:{org}/{repo}:{tag}"
        yield Found(local, "llama.cpp", name=name, aliases=(f"llama.cpp:{org}/{repo}",) if tag == "latest" else ())
    for e in entries:
        if e.name.startswith("models--"):
            continue
        low = e.name.lower()
        if low.endswith(".gguf") and e.name not in claimed and not low.startswith("mmproj"):
            what = _special(e)
            if what:
                problems.append(Problem(e.path, not_regular_why(what)))
                continue
            shard = shard_of(e.name)
            if shard is None or shard[0] == 1:
                yield Found(Path(e.path), "llama.cpp", name=f"llama.cpp:{e.name}")
    if any(e.name.startswith("models--") for e in entries):
        yield from hf_hub(top, problems, source="llama.cpp", prefix="llama.cpp:")


def _kind_at(p: Path) -> str | None:
    """None for a regular file at ``p``; "missing", or what it is (a FIFO, a folder ...), otherwise."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return "missing"
    if stat.S_ISDIR(mode):
        return "a folder"
    return kind_of(mode)


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """ollama's own name for a manifest (``qwen3:8b``; ``user/model:tag``; ``host/ns/model:tag``)."""
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def ollama(top: Path, problems: list[Problem]) -> Iterator[Found]:
    """ollama's store: ``manifests/<registry>/<namespace>/<model>/<tag>`` name the model layer's blob
    ``blobs/sha256-<hex>``; each model is named as ollama names it (``ollama:qwen3:8b``)."""
    mdir, blobs = top / "manifests", top / "blobs"
    found: list[Found] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(mdir, ())]
    seen: set[tuple[int, int]] = set()
    while stack:
        d, parts = stack.pop()
        entries = _enter(d, seen, problems, missing_ok=d == mdir)  # a store with no models has no manifests yet
        if entries is None:
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            here = (*parts, e.name)
            try:
                is_dir = e.is_dir()
            except OSError as exc:
                problems.append(Problem(e.path, _why(exc)))
                continue
            if is_dir and len(here) < 4:
                stack.append((Path(e.path), here))
            elif not is_dir and len(here) == 4:
                f = _ollama_manifest(Path(e.path), here, blobs, problems)
                if f is not None:
                    found.append(f)
    # a blob several tags name (qwen3:latest and qwen3:8b) is one model: a tag other than latest names it
    found.sort(key=lambda f: (f.name.endswith(":latest"), f.name))
    yield from found


def _ollama_manifest(path: Path, parts: tuple[str, ...], blobs: Path, problems: list[Problem]) -> Found | None:
    try:
        doc = json.loads(_read_small(path, MAX_MANIFEST))
        layers = doc["layers"]
        digest = next(x["digest"] for x in layers if isinstance(x, dict) and x.get("mediaType") == OLLAMA_MODEL_LAYER)
        if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-fA-F]{64}", digest):
            raise ValueError(f"the model layer's digest {digest!r} is not sha256:<64 hex digits>")
    except StopIteration:
        problems.append(Problem(str(path), "an ollama manifest with no model layer"))
        return None
    except OSError as exc:
        problems.append(Problem(str(path), f"not an ollama manifest ({_oserror(exc)})"))
        return None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        problems.append(Problem(str(path), f"not an ollama manifest ({type(exc).__name__}: {exc})"))
        return None
    blob = blobs / digest.replace(":", "-")
    what = _kind_at(blob)
    if what:
        problems.append(Problem(str(path), f"names the model blob {digest}, which is " + (
            f"not in {blobs}" if what == "missing" else f"{not_regular_why(what)} ({blob})")))
        return None
    name = "ollama:" + ollama_name(*parts)
    aliases = (name[:-len(":latest")],) if name.endswith(":latest") else ()
    return Found(blob, "ollama", name=name, aliases=aliases)


def folder(top: Path, problems: list[Problem]) -> Iterator[Found]:
    """A folder the user added: every GGUF file and model folder under it, each named by its path."""
    if not top.exists():
        problems.append(Problem(str(top), "a model folder you added is not there (a disk not mounted?); "
                                          "remove it with specview models --remove-folder"))
        return
    for path, _kind in walk(top, problems):
        yield Found(path, "folder", name=str(path))


def demo(top: Path, problems: list[Problem], shipped: Path | None) -> Iterator[Found]:
    """The demo's files: the shipped Q4_1 (``demo:Q4_1``, also ``demo``), the quantizations derived into the
    cache (``demo:Q8_0`` ...) and the newest tiny drafter of each kind (``demo:eagle3`` ...)."""
    if shipped is not None:
        q = _DEMO_QUANT.match(shipped.name)
        yield Found(shipped, "demo", name=f"demo:{q.group(1) if q else 'Q4_1'}", aliases=("demo",))
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except FileNotFoundError:
        return
    except OSError as exc:
        problems.append(Problem(str(top), _why(exc)))
        return
    drafters: dict[str, tuple[int, Path]] = {}
    for e in entries:
        q, d = _DEMO_QUANT.match(e.name), _DEMO_DRAFTER.match(e.name)
        if q and (shipped is None or Path(e.path) != shipped):
            yield Found(Path(e.path), "demo", name=f"demo:{q.group(1)}")
        elif d and int(d.group(2)) >= drafters.get(d.group(1), (-1, None))[0]:
            drafters[d.group(1)] = (int(d.group(2)), Path(e.path))
    for kind, (_v, p) in sorted(drafters.items()):
        yield Found(p, "demo", name=f"demo:{kind}")
