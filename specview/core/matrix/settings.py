"""What a matrix takes from the settings' declarations: its axes, the settings its cells share, a drafter's parts.

Nothing here lists a setting by hand.  The scalar axes are the settings
:mod:`specview.core.config` declares with ``axis=True`` (:func:`~specview.core.config.axes`);
every other declared setting of a run is a value all cells share (:func:`cell_settings`).  Only the
matrix's own structure is named: the targets, drafters and prompts axes (which give a cell its
model, draft, spec type and prompt), and the drafters axis's values (:func:`drafter_parts`).
"""

from __future__ import annotations

from dataclasses import Field
from typing import Any

from ..config import DRAFT_FILE_TYPES, LLAMA_SPEC_TYPES, axes, declared, default_of, field_of, settings_class

#: drafters that are a spec type alone, with no draft model file: none, draft-mtp (the target's own head) and the
#: n-gram types
NON_MODEL_DRAFTERS = tuple(t for t in LLAMA_SPEC_TYPES if t not in DRAFT_FILE_TYPES)


def drafter_parts(name: str) -> tuple[str, str | None]:
    """A drafters-axis value's spec type and draft model.

    ``ngram-mod`` -> (ngram-mod, None); ``draft-eagle3:eagle.gguf`` -> (draft-eagle3, eagle.gguf);
    ``demo:dspark`` -> (draft-dspark, demo:dspark); any other model (``demo:Q4_0``, ``small.gguf``) ->
    (draft-simple, the model).
    """
    from ..demo import demo_drafter

    if name in NON_MODEL_DRAFTERS:
        return name, None
    if demo_drafter(name):  # demo:eagle3, demo:dflash, demo:dspark name their spec type themselves
        return demo_drafter(name), name
    for t in DRAFT_FILE_TYPES:
        if name.startswith(t + ":") and len(name) > len(t) + 1:
            return t, name[len(t) + 1:]
    return "draft-simple", name


#: what a cell gets from the matrix's structure (its target, drafter and prompt) rather than from a setting
STRUCTURAL = ("target", "draft", "spec_type", "prompt", "prompt_tokens", "chat", "backend")
#: where a matrix's default differs from a single run's
MATRIX_DEFAULTS: dict[str, Any] = {"max_tokens": 128}
#: the group of the axes that only mean something for a draft model (n_max, p_min)
DRAFT_GROUP = "speculation"


def axis_fields() -> list[Field]:
    """The declared settings a matrix may vary, in declaration order."""
    return [field_of(settings_class(n), n) for n in axes()]


def draft_axes() -> tuple[str, ...]:
    """Axes that apply only to draft-model cells (n_max, p_min): None in ngram-simple and none cells."""
    return tuple(f.name for f in axis_fields() if f.metadata.get("group") == DRAFT_GROUP)


def engine_axes() -> tuple[str, ...]:
    """Axes that apply to every cell (flash attention)."""
    return tuple(f.name for f in axis_fields() if f.metadata.get("group") != DRAFT_GROUP)


def cell_settings(cls: type) -> list[Field]:
    """``cls``'s declared settings that every cell shares (neither an axis nor part of the matrix's structure)."""
    ax = set(axes())
    return [f for f in declared(cls) if f.name not in ax and f.name not in STRUCTURAL]


def matrix_default(f: Field) -> Any:
    """A shared setting's default in a matrix (:data:`MATRIX_DEFAULTS`, else its declared default)."""
    return MATRIX_DEFAULTS.get(f.name, default_of(f))


def axis_label(name: str) -> str:
    """How a summary names an axis: the setting's label in lower case ("flash attention", "n_max")."""
    f = field_of(settings_class(name), name)
    label = f.metadata.get("label") or name
    return label if label == name else label.lower()


def axis_short(name: str) -> str:
    """The short name a cell label gives an engine axis: its short flag without dashes ("fa")."""
    f = field_of(settings_class(name), name)
    flags = [x for x in f.metadata.get("flags", ()) if not x.startswith("--")]
    return flags[0].lstrip("-") if flags else name
