"""Where models are looked for (:func:`default_roots`) and the scan that finds them (:func:`scan`)."""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from .info import ProgressFn, Root, Scan


def default_roots(home: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> list[Root]:
    """The stores' folders on this machine, in the order they are scanned (only those that exist):
    LM Studio's models folder(s), ollama's store, the Hugging Face hub cache, llama.cpp's download cache,
    the folders the user added, and the demo's cache.  ``home`` and ``env`` stand in for ``~`` and
    ``os.environ`` (the tests build stores in a temporary home)."""
    raise NotImplementedError


def scan(roots: Iterable[Root] | None = None, *, home: str | os.PathLike[str] | None = None,
         env: Mapping[str, str] | None = None, cache: bool = True, progress: ProgressFn | None = None) -> Scan:
    """Every model under ``roots`` (default: :func:`default_roots`), and a :class:`Problem` for each thing
    skipped (a corrupt or truncated file, a manifest naming a missing blob, an unreadable folder, a
    symlink loop, a file that is not a model).  Nothing raises past the scan.

    ``cache``: reuse header reads recorded by path, size and mtime (in specview's cache folder).
    ``progress`` gets a line per root.
    """
    raise NotImplementedError

