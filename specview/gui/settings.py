"""The app's remembered settings: the run on screen and the app's own choices, in one JSON file.

The run is stored in the shape of :meth:`RunConfig.to_dict` (the trace's
``config`` block), so it is read back through :meth:`RunConfig.from_dict`'s
field names and the controls generated from the same declarations.  It is
stored even when it is not a valid run yet (an empty prompt, say): the
controls are restored as the user left them, and the run is checked when it
is started.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..core.config import EngineSettings, RunConfig
from ..core.demo import DEMO_PROMPT
from ..core.errors import SpecviewError
from ..core.paths import settings_dir
from ..core.registry import Runner
from ..core.resolve import DECIDED_KEY

#: the app's own settings (not part of a run), with their defaults
APP_DEFAULTS: dict[str, Any] = {
    "diagnose": True,
    "auto_run": True,
    "boundaries": False,
    "theme": "system",
    "recent": [],
}
RECENT_MAX = 12


def default_run() -> dict[str, Any]:
    """The run the app opens with: the demo target and draft on the demo prompt, with this machine's decisions.

    What the machine decides (:mod:`specview.core.resolve`: no repack where a multi-token decode of repacked
    weights crashed this llama.cpp build; the demo quantization that can fork here, where ``specview run``
    measured it) is taken from what is already known, so opening the app never waits; the decisions and
    their reasons are kept under ``decided``, and a setting the user leaves alone stays the machine's.
    """
    cfg = RunConfig(prompt=DEMO_PROMPT)
    try:
        resolved = Runner.resolve(cfg, default_target=True, measure=False)
    except Exception:  # noqa: BLE001 - a backend that cannot answer leaves llama.cpp's own defaults
        return cfg.to_dict()
    d = resolved.config.to_dict()
    if resolved.decisions:
        d[DECIDED_KEY] = resolved.to_dict()
    return d


def default_settings_path() -> Path:
    return settings_dir() / "gui.json"


def _run_names() -> tuple[set[str], set[str]]:
    return {f.name for f in fields(RunConfig)}, {f.name for f in fields(EngineSettings)}


def _from_flat(d: dict[str, Any]) -> dict[str, Any]:
    """A run from a settings file written before runs were stored whole (its setting names were flat)."""
    run_names, engine_names = _run_names()
    run = {k: v for k, v in d.items() if k in run_names and k != "engine"}
    run["engine"] = {k: v for k, v in d.items() if k in engine_names}
    if isinstance(d.get("engine"), str):  # the engine's name was stored as "engine"
        run["backend"] = d["engine"]
    return run


def read_settings(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The settings in ``path``: ``{"run": {...}, **app settings, "geometry"?}``; defaults for what is missing.

    An unreadable or malformed file gives the defaults: settings are a convenience, never a reason to fail.
    """
    out: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in APP_DEFAULTS.items()}
    out["run"] = default_run()
    if path is None:
        return out
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return out
    if not isinstance(d, dict):
        return out
    for k, default in APP_DEFAULTS.items():
        if isinstance(d.get(k), type(default)):
            out[k] = d[k]
    out["recent"] = [x for x in out["recent"] if isinstance(x, str)][:RECENT_MAX]
    if isinstance(d.get("geometry"), str):
        out["geometry"] = d["geometry"]
    run = d.get("run") if isinstance(d.get("run"), dict) else _from_flat(d)
    merged = default_run()
    for k, v in run.items():
        if k == "engine" and isinstance(v, dict):
            merged["engine"].update(v)
        elif k != "engine":
            merged[k] = v
    out["run"] = merged
    return out


def write_settings(path: str | os.PathLike[str] | None, settings: dict[str, Any]) -> bool:
    """Write ``settings`` atomically; False (and nothing written) when the folder cannot be written."""
    if path is None:
        return False
    from ..core.trace import write_atomic

    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, json.dumps(settings, indent=1))
    except (OSError, SpecviewError, TypeError, ValueError):
        return False
    return True


def remember(recent: list[str], *names: str | None) -> list[str]:
    """``recent`` with the model paths among ``names`` moved to the front (demo names are always offered)."""
    out = [x for x in recent if isinstance(x, str)]
    for name in names:
        if name and not name.lower().startswith("demo"):
            if name in out:
                out.remove(name)
            out.insert(0, name)
    return out[:RECENT_MAX]


def restore_geometry(window: Any, geometry: Any) -> None:
    """Put ``window`` where it was (``geometry`` as saved); on a small screen use all of it, else a good size."""
    import base64

    from PySide6.QtCore import QByteArray
    from PySide6.QtWidgets import QApplication

    if isinstance(geometry, str):
        try:
            if window.restoreGeometry(QByteArray(base64.b64decode(geometry))):
                return
        except (ValueError, TypeError):
            pass
    screen = QApplication.primaryScreen()
    avail = screen.availableGeometry() if screen is not None else None
    if avail is not None and avail.width() <= 1700 and avail.height() <= 1100:
        window.setGeometry(avail)
    else:
        window.resize(1480, 920)
