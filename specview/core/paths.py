"""Where specview keeps what it derives (demo quantizations, built binaries, MLX copies), its settings, and the
results of the matrices and quality runs the app starts."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from .errors import SpecviewError


def _folder(variable: str, platform_folder: str, below: str = "") -> Path:
    """``$variable`` when set, else ``below`` in platformdirs' ``platform_folder`` ("user_cache_dir", ...) for
    specview."""
    env = os.environ.get(variable)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(getattr(platformdirs, platform_folder)("specview", appauthor=False)) / below


def cache_dir() -> Path:
    """``$SPECVIEW_CACHE``, else the platform's user cache folder for specview."""
    return _folder("SPECVIEW_CACHE", "user_cache_dir")


def settings_dir() -> Path:
    """The app's settings folder (``$SPECVIEW_CONFIG_DIR`` overrides it, as the tests do)."""
    return _folder("SPECVIEW_CONFIG_DIR", "user_config_dir")


def results_dir() -> Path:
    """Where the app keeps the matrices and quality runs it starts without an output folder: ``$SPECVIEW_RESULTS``,
    else ``results`` in the platform's user data folder for specview."""
    return _folder("SPECVIEW_RESULTS", "user_data_dir", "results")


def new_results_folder(kind: str, label: str = "") -> Path:
    """A new, empty folder for one run's results, ``<results_dir>/<kind>/<UTC time>-<label>-<unique>``: sorted by
    name it lists the runs in the order they started. Raises :class:`SpecviewError` naming the folder when it
    cannot be made."""
    parent = results_dir() / kind
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.")[:40]
    prefix = time.strftime("%Y%m%d-%H%M%S-", time.gmtime()) + (f"{slug}-" if slug else "")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as exc:
        raise SpecviewError(f"cannot make a results folder in {parent}: {exc.strerror or exc}; "
                            "set $SPECVIEW_RESULTS to a writable folder") from None


# -- what a process keeps in the temporary folder while it runs --------------------------------------------------------
#: in a folder a process keeps there, the file that keeps the folder past the process (a crash's account names its log)
KEEP_FILE = "kept-for-the-bug-report"
_OWNED = re.compile(r"^specview-(\d+)-[a-z]")
_swept = False


def temp_prefix(what: str) -> str:
    """The start of the name of a file or folder this process keeps in the temporary folder while it runs (an engine
    worker's folder, a server's log): ``specview-PID-what-``.  The process removes it when done; where it was
    killed before it could (SIGKILL, the out-of-memory killer, a crash in Qt), :func:`sweep_orphans` does."""
    return f"specview-{os.getpid()}-{what}-"


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (another user's counts as running: it cannot be asked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep_orphans(tmp: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove what processes that are gone kept in the temporary folder (:func:`temp_prefix`'s names, this user's,
    no process of that pid, and no :data:`KEEP_FILE` in a folder).  The paths removed."""
    folder = os.fspath(tmp) if tmp is not None else tempfile.gettempdir()
    gone: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return gone
    for e in entries:
        m = _OWNED.match(e.name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            if e.stat(follow_symlinks=False).st_uid != os.getuid() or process_alive(int(m.group(1))):
                continue
            if e.is_dir(follow_symlinks=False):
                if os.path.exists(os.path.join(e.path, KEEP_FILE)):
                    continue
                shutil.rmtree(e.path)
            elif e.is_file(follow_symlinks=False):
                os.unlink(e.path)
            else:
                continue
        except (OSError, AttributeError):  # AttributeError: no getuid (Windows), where nothing is swept
            continue
        gone.append(e.path)
    return gone


def sweep_orphans_once() -> None:
    """:func:`sweep_orphans`, the first time a process asks (before its first worker or server)."""
    global _swept
    if not _swept:
        _swept = True
        sweep_orphans()
