"""One model's facts from its header: :func:`read_header`, for a GGUF file or a model folder."""

from __future__ import annotations

import os

from .info import ModelInfo


def read_header(path: str | os.PathLike[str], *, name: str | None = None, source: str = "folder") -> ModelInfo:
    """What the header of the GGUF file or model folder at ``path`` says (no weights read).

    ``name`` and ``source`` are what the scan found it as (a path and "folder"
    by default).  A file that is not a model, truncated or corrupt raises
    :class:`~specview.core.models.info.ModelHeaderError` naming the file.
    """
    raise NotImplementedError
