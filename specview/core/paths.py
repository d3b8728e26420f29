"""Where specview keeps what it derives: demo quantizations, built binaries, MLX copies."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SPECVIEW_CACHE``, else the platform's user cache folder for specview."""
    env = os.environ.get("SPECVIEW_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("specview", appauthor=False))


def settings_dir() -> Path:
    """The app's settings folder (``$SPECVIEW_CONFIG_DIR`` overrides it, as the tests do)."""
    env = os.environ.get("SPECVIEW_CONFIG_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("specview", appauthor=False))
