"""Model discovery: the GGUF files and model folders a user already has, found read-only and offline.

specview looks where the tools people run models with keep them (LM Studio,
ollama, the Hugging Face hub cache mlx-lm and ``huggingface-cli`` fill,
llama.cpp's ``-hf`` download cache), in the folders the user added, and in the
demo's cache.  Each model is described from its header alone (a bounded read
of a GGUF's metadata and tensor table, a folder's ``config.json``, tokenizer
and safetensors headers): never a whole file, never the weights.

The public API (the CLI's ``specview models`` and the app's pickers are built
on it, nothing else):

* :func:`scan` -> :class:`Scan` (``models``, ``problems``); :func:`default_roots`;
  :func:`user_folders` / :func:`add_folder` / :func:`remove_folder`;
* :func:`read_header` -> :class:`ModelInfo` (or :class:`ModelHeaderError`);
* :func:`resolve_name` / :func:`is_store_name`: ``ollama:qwen3:8b`` (``ollama:qwen3`` is
  ``:latest``), ``hf:org/repo[:QUANT|:TAG|:FILE]`` (llama.cpp's ``-hf`` tag form),
  ``lmstudio:pub/repo[/FILE.gguf]``, ``llama.cpp:...``;
* :func:`drafters_for` -> [:class:`DrafterFit`]; :func:`check_drafter`; :func:`no_fit_reason`;
* :func:`specview.core.models.preflight.refusal`: the drafter checks a run's headers answer, before any load.

Only regular files are opened (:mod:`.files`: a FIFO, socket or device is a
skipped entry, never waited on), and a header read is bounded in work and
memory whatever the file claims (:mod:`.gguf`).  No Qt, no backend, no
network, no ``gguf`` package: this runs wherever specview's core runs.
"""

from __future__ import annotations

from .drafters import NO_DRAFTER_SPEC_TYPES, check_drafter, drafters_for, no_fit_reason
from .folders import add_folder, folders_file, remove_folder, user_folders
from .header import read_header
from .info import (DRAFTER_SPEC_TYPES, KINDS, SOURCES, DrafterFit, ModelHeaderError, ModelInfo, Problem, Root,
                   Scan, VocabPrint)
from .names import STORE_PREFIXES, is_store_name, resolve_name
from .scan import default_roots, scan

__all__ = [
    "DRAFTER_SPEC_TYPES", "KINDS", "NO_DRAFTER_SPEC_TYPES", "SOURCES", "STORE_PREFIXES",
    "DrafterFit", "ModelHeaderError", "ModelInfo", "Problem", "Root", "Scan", "VocabPrint",
    "add_folder", "check_drafter", "default_roots", "drafters_for", "folders_file", "is_store_name",
    "no_fit_reason", "read_header", "remove_folder", "resolve_name", "scan", "user_folders",
]
