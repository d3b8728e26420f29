"""The folders a user added to discovery: ``models.json`` in specview's settings folder, shared with the app.

The file holds ``{"folders": [...]}``; it is written atomically, and a
damaged one is reported (never silently replaced: it is the user's list).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecviewError
from ..jsonfile import write_atomic
from ..paths import settings_dir
from .files import NotRegular, read_text

FILE_NAME = "models.json"
#: the largest list of folders read
MAX_FILE = 4 << 20


def folders_file(config_dir: str | os.PathLike[str] | None = None) -> Path:
    """``models.json`` in specview's settings folder (``$SPECVIEW_CONFIG_DIR`` overrides the folder)."""
    return Path(config_dir).expanduser() / FILE_NAME if config_dir else settings_dir() / FILE_NAME


def _load(f: Path) -> dict:
    try:
        doc = json.loads(read_text(f, MAX_FILE))
    except FileNotFoundError:
        return {"folders": []}
    except NotRegular as exc:
        raise SpecviewError(f"{f}: cannot read the list of model folders: it is {exc.what}, not a file; delete it") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise SpecviewError(f"{f}: cannot read the list of model folders ({exc}); fix or delete the file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("folders", []), list):
        raise SpecviewError(f"{f}: not a list of model folders ({{\"folders\": [...]}}); fix or delete the file")
    doc["folders"] = [str(x) for x in doc.get("folders", []) if isinstance(x, str)]
    return doc


def user_folders(config_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The folders the user added, in the order added (absolute paths; a missing one is kept: it may be a
    disk that is not mounted now, and the scan says so)."""
    return list(_load(folders_file(config_dir))["folders"])


def _write(f: Path, doc: dict) -> None:
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecviewError(f"{f.parent}: cannot create specview's settings folder ({exc.strerror or exc}); "
                            "set $SPECVIEW_CONFIG_DIR to a writable folder") from None
    write_atomic(f, json.dumps(doc, indent=1) + "\n")


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def add_folder(path: str | os.PathLike[str], config_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Remember ``path`` (made absolute) for every later scan; returns the folders now remembered.
    A path that is not a folder is refused with a :class:`~specview.core.errors.SpecviewError`."""
    p = _absolute(path)
    if not os.path.isdir(p):
        raise SpecviewError(f"{p}: not a folder; give the folder that holds your GGUF files or model folders")
    f = folders_file(config_dir)
    doc = _load(f)
    if p not in doc["folders"]:
        doc["folders"].append(p)
        _write(f, doc)
    return list(doc["folders"])


def remove_folder(path: str | os.PathLike[str], config_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Forget ``path``; returns the folders still remembered.  A folder not in the list is an error that
    lists those that are."""
    p = _absolute(path)
    f = folders_file(config_dir)
    doc = _load(f)
    if p not in doc["folders"] and str(path) not in doc["folders"]:
        have = ", ".join(doc["folders"]) or "none"
        raise SpecviewError(f"{p}: not one of the model folders specview looks in (those are: {have})")
    doc["folders"] = [x for x in doc["folders"] if x not in (p, str(path))]
    _write(f, doc)
    return list(doc["folders"])
