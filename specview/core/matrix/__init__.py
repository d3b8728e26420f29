"""The reproducer matrix: every combination of a few settings, both arms each, one verdict per cell.

A matrix answers "which setting makes speculative decoding differ from plain
greedy?" by running one cell per combination of its axes and naming, in plain
words, which axis value alone flips the outcome; over the prompt suite it
gives rates with intervals instead of anecdotes.

Axes: ``targets`` (GGUF files, model folders or ``demo:QUANT`` names),
``drafters`` (draft models, meaning ``draft-simple``, or ``ngram-simple`` /
``none``), ``prompts``, and every setting :mod:`specview.core.config` declares
as an axis (``n_max``, ``p_min``: draft-simple cells only; ``flash_attn``).

* :mod:`.spec`      the definition, from TOML, flags or a matrix file
* :mod:`.settings`  what it takes from the settings' declarations: its axes, its cells' shared settings
* :mod:`.validate`  its checks, each refusing a bad value with the file and the field
* :mod:`.cells`     the cells, their run settings and their records
* :mod:`.run`       running the cells on the engine's runner, streamed to the file
* :mod:`.document`  reading a matrix file, every field checked
* :mod:`.summary`   the grid and the plain-words summary
* :mod:`.rates`     divergence rates with intervals, fork positions, gap severity
* :mod:`.evidence`  a cited kernel map: each cell's prediction, the sentences that compare them
* :mod:`.suite`     the built-in prompt suite as a matrix
* :mod:`.quality`   a task suite as a matrix: each cell's answers scored, whether speculation changed them
"""

from __future__ import annotations

from ..prompts import PromptSpec, builtin_prompts, prompt_from_file
from .cells import CellParams, cell_config, cell_record, describe, error_record, expand, model_label
from .document import SCHEMA, load_matrix, validate_matrix
from .evidence import contradiction_lines, group_prediction, kernel_lines, prediction_of
from .rates import format_rates, rates, wilson
from .run import MatrixRun, fmt_seconds, run_cell, run_matrix
from .spec import NON_MODEL_DRAFTERS, MatrixError, MatrixSpec, load_spec, spec_from_dict, toml_keys
from .summary import AXIS_NAMES, COL_AXES, ROW_AXES, Grid, axis_value_label, grid, summarize

__all__ = [
    "SCHEMA", "NON_MODEL_DRAFTERS", "AXIS_NAMES", "ROW_AXES", "COL_AXES",
    "MatrixError", "MatrixSpec", "PromptSpec", "CellParams", "MatrixRun", "Grid",
    "builtin_prompts", "prompt_from_file", "spec_from_dict", "load_spec", "toml_keys",
    "expand", "cell_config", "cell_record", "error_record", "describe", "model_label",
    "run_matrix", "run_cell", "fmt_seconds", "validate_matrix", "load_matrix",
    "grid", "summarize", "axis_value_label", "rates", "format_rates", "wilson",
    "kernel_lines", "contradiction_lines", "group_prediction", "prediction_of",
]
