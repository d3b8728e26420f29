"""The folders a user added to discovery: a JSON file in specview's settings folder, shared with the app."""

from __future__ import annotations

from pathlib import Path


def folders_file() -> Path:
    """``models.json`` in specview's settings folder (``$SPECVIEW_CONFIG_DIR`` overrides the folder)."""
    raise NotImplementedError


def user_folders() -> list[str]:
    """The folders the user added, in the order added (absolute paths; a missing one is kept: it may be a
    disk that is not mounted now, and the scan says so)."""
    raise NotImplementedError


def add_folder(path: str) -> list[str]:
    """Remember ``path`` (made absolute) for every later scan; returns the folders now remembered.
    A path that is not a folder is refused with a :class:`~specview.core.errors.SpecviewError`."""
    raise NotImplementedError


def remove_folder(path: str) -> list[str]:
    """Forget ``path``; returns the folders still remembered.  A folder not in the list is an error that
    lists those that are."""
    raise NotImplementedError
