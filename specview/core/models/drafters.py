"""Which models can draft for a target, and why a hand-picked draft is refused: from headers alone.

The vocabulary rule is llama.cpp's (``common_speculative_are_compatible``):
the same tokenizer kind, sizes within 128 of each other, the same token
strings where both have them.  From headers that reads: equal fingerprints,
or, for sizes that differ, equal hashes of every full 256-token block the
smaller vocabulary has (its last partial block is not compared).  A head
(EAGLE-3, DFlash, DSpark) also needs the target's hidden width and layers.
"""

from __future__ import annotations

import math
from typing import Iterable

from ..config import DRAFT_FILE_TYPES, LLAMA_SPEC_TYPES
from .info import DRAFTER_SPEC_TYPES, DrafterFit, ModelInfo, VocabPrint

#: spec types that draft from no second model: the target's own text (n-gram lookups, always available)
NO_DRAFTER_SPEC_TYPES = tuple(t for t in LLAMA_SPEC_TYPES if t.startswith("ngram-"))
#: llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_SIZE_SLACK = 128
_HEAD_LABEL = {"eagle3": "an EAGLE-3", "dflash": "a DFlash", "dspark": "a DSpark"}


def vocab_mismatch(target: VocabPrint | None, draft: VocabPrint | None) -> str | None:
    """None when the two vocabularies can draft for each other; else what differs, with both fingerprints."""
    if target is None or draft is None:
        which = "target's" if target is None else "draft's"
        return f"the {which} header has no vocabulary (tokenizer.ggml.tokens), so nothing says they match"
    if target.digest == draft.digest and target.n == draft.n:
        return None
    both = f"target {target}, draft {draft}"
    if target.model and draft.model and target.model != draft.model:
        return f"vocabulary mismatch: a {draft.model} tokenizer cannot draft for a {target.model} one ({both})"
    if abs(target.n - draft.n) > VOCAB_SIZE_SLACK:
        return (f"vocabulary mismatch: {draft.n} tokens against the target's {target.n} (llama.cpp allows "
                f"{VOCAB_SIZE_SLACK} apart; {both})")
    if target.n == draft.n:
        if target.texts and target.texts == draft.texts:
            return f"vocabulary mismatch: the same token strings with other token types ({both})"
        return f"vocabulary mismatch: the token strings differ ({both})"
    full = min(target.n, draft.n) // 256
    if full and len(target.blocks) >= full and len(draft.blocks) >= full and \
            target.blocks[:full] == draft.blocks[:full]:
        return None  # one is the other plus padding tokens past the smaller one's end
    return f"vocabulary mismatch: the token strings differ ({both})"


def _ratio(target: ModelInfo, draft: ModelInfo) -> float | None:
    if target.n_params and draft.n_params:
        return draft.n_params / target.n_params
    return None


def check_drafter(target: ModelInfo, draft: ModelInfo, spec_type: str) -> str | None:
    """None when ``draft`` can draft for ``target`` with ``spec_type``; else the reason it cannot, in one line
    (a vocabulary mismatch names both fingerprints; a head made for another target says whose it is)."""
    if spec_type not in DRAFT_FILE_TYPES:
        if spec_type == "draft-mtp":
            return ("draft-mtp drafts with the target's own MTP heads, not a second model" if target.mtp else
                    f"{target.name} has no MTP heads ({target.arch}.nextn_predict_layers is 0 or absent), "
                    "so draft-mtp cannot draft for it")
        return f"{spec_type} drafts from no second model: leave the draft out"
    if draft.kind != target.kind:
        return (f"{draft.name} is a {'GGUF file' if draft.kind == 'gguf' else 'model folder'} and the target a "
                f"{'GGUF file' if target.kind == 'gguf' else 'model folder'}: one engine runs both, so they must be "
                "of one kind")
    if target.is_drafter:
        return f"{target.name} is {_HEAD_LABEL[target.drafter_kind or '']} head, not a target"
    want = DRAFTER_SPEC_TYPES.get(draft.drafter_kind or "")
    if spec_type == "draft-simple":
        if want is not None:
            return (f"{draft.name} is {_HEAD_LABEL[draft.drafter_kind or '']} head, not a model that drafts on its "
                    f"own: use it with --spec-type {want}")
        return vocab_mismatch(target.vocab, draft.vocab)
    if want != spec_type:
        what = (f"{_HEAD_LABEL[draft.drafter_kind or '']} head (--spec-type {want})" if want else
                "a model, not a drafter head")
        return f"{draft.name} is {what}; {spec_type} needs {_HEAD_LABEL[spec_type[6:]]} head made for the target"
    bad = vocab_mismatch(target.vocab, draft.vocab)
    if bad:
        return f"a head made for another target ({draft.drafter_for or 'its header does not say which'}): {bad}"
    if draft.n_embd and target.n_embd and draft.n_embd != target.n_embd:
        return (f"a head made for another target ({draft.drafter_for or 'its header does not say which'}): it reads "
                f"hidden states {draft.n_embd} wide, {target.name}'s are {target.n_embd}")
    if draft.target_layers and target.n_layer and max(draft.target_layers) > target.n_layer:
        return (f"a head made for another target ({draft.drafter_for or 'its header does not say which'}): it reads "
                f"layer {max(draft.target_layers)}, {target.name} has {target.n_layer}")
    return None


def drafters_for(target: ModelInfo, models: Iterable[ModelInfo], spec_type: str | None = None) -> list[DrafterFit]:
    """The models that can draft for ``target``, smallest first, each with the spec types it serves.

    A separate draft model (``draft-simple``) needs the target's vocabulary
    and no more parameters than the target; an EAGLE-3 / DFlash / DSpark head
    must have been made for this target (its vocabulary and hidden width);
    the target's own MTP heads serve ``draft-mtp`` (a fit whose ``model`` is
    None), and the n-gram types need no drafter at all (one last fit, ``model``
    None).  ``spec_type`` keeps only the fits that serve it.
    """
    fits: list[DrafterFit] = []
    for m in models:
        if m.path == target.path:
            continue
        st = DRAFTER_SPEC_TYPES.get(m.drafter_kind or "", "draft-simple")
        if check_drafter(target, m, st) is not None:
            continue
        r = _ratio(target, m)
        if st == "draft-simple" and r is not None and r > 1:
            continue  # a larger model drafts slower than the target decodes
        size = f"{1 / r:.1f}x smaller" if r else "size unknown"
        if st == "draft-simple":
            why = f"the target's vocabulary ({m.vocab}), {size}" if r is None or r < 1 else \
                f"the target's vocabulary ({m.vocab}), as many parameters ({m.quant or '?'} weights)"
        else:
            why = f"{_HEAD_LABEL[m.drafter_kind or '']} head for this target, {size}"
        fits.append(DrafterFit(m, (st,), r, why))
    fits.sort(key=lambda f: (f.ratio if f.ratio is not None else math.inf, f.model.size if f.model else 0,
                             f.model.name if f.model else ""))
    if target.mtp:
        fits.append(DrafterFit(None, ("draft-mtp",), None, "the target's own MTP heads draft: no second model"))
    fits.append(DrafterFit(None, NO_DRAFTER_SPEC_TYPES, None,
                           "n-gram lookups in the text so far: no drafter model, always available"))
    if spec_type is not None:
        fits = [f for f in fits if spec_type in f.spec_types]
    return fits


def _why_none(target: ModelInfo, others: list[ModelInfo], spec_type: str) -> str:
    """Why none of ``others`` drafts for ``target`` with ``spec_type``: the spec type's own need first."""
    if spec_type == "none" or spec_type in NO_DRAFTER_SPEC_TYPES:
        return f"{spec_type} needs no drafter model" + (" (n-gram lookups in the text so far)"
                                                         if spec_type != "none" else "")
    if spec_type == "draft-mtp":
        return check_drafter(target, target, spec_type) or "draft-mtp drafts with the target's own MTP heads"
    kind = [m for m in others if m.kind == target.kind]
    if spec_type == "draft-simple":
        models = [m for m in kind if not m.is_drafter]
        if not models:
            return f"draft-simple: no other model of this kind was found (the {len(others)} found are heads)" \
                if others else "draft-simple: no other model was found"
        same = [m for m in models if vocab_mismatch(target.vocab, m.vocab) is None]
        bigger = [m for m in same if (_ratio(target, m) or 0) > 1]
        bits = [f"{len(models) - len(same)} have another vocabulary"] if len(models) > len(same) else []
        if bigger:
            bits.append(f"{len(bigger)} have its vocabulary but more parameters (a drafter must be smaller)")
        return f"draft-simple: of the {len(models)} models found, " + ", ".join(bits or ["none fits"])
    label = _HEAD_LABEL.get(spec_type[6:], "a drafter")
    heads = [m for m in kind if DRAFTER_SPEC_TYPES.get(m.drafter_kind or "") == spec_type]
    if not heads:
        return (f"{spec_type}: none of the {len(kind)} models found is {label} head ({spec_type} needs {label} "
                "head made for this target, not a draft model)")
    why = "; ".join(f"{m.name}: {check_drafter(target, m, spec_type)}" for m in heads[:3])
    more = f" and {len(heads) - 3} more" if len(heads) > 3 else ""
    return f"{spec_type}: the {len(heads)} {label[2:] if label.startswith('a ') else label[3:]} head(s) found " \
           f"were made for other targets ({why}{more})"


def no_fit_reason(target: ModelInfo, models: Iterable[ModelInfo], spec_type: str | None = None) -> str:
    """Why no model found drafts for ``target``, in one line: for ``spec_type``, or for each spec type a drafter
    model serves (a separate draft model, then each head)."""
    others = [m for m in models if m.path != target.path]
    types = [spec_type] if spec_type else list(DRAFT_FILE_TYPES)
    return "no compatible drafter here: " + "; ".join(_why_none(target, others, st) for st in types)
