"""Where specview keeps what it derives (demo quantizations, built binaries, MLX copies), its settings, and the
results of the matrices and quality runs the app starts."""

from __future__ import annotations

import os
import re
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
