"""Which models can draft for which, from headers: vocabularies, EAGLE-3 / DFlash / DSpark heads, MTP heads."""

from __future__ import annotations

import pytest

from specview.core import models as M
from specview.core.models.drafters import NO_DRAFTER_SPEC_TYPES
from stores import header_gguf
from tinymodel import vocab_tokens

N_VOCAB = len(vocab_tokens()[0])


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    n_embd, n_layer = 64, 2
    target_meta = {"llama.embedding_length": n_embd, "llama.block_count": n_layer, "llama.context_length": 4096}
    big = {"token_embd.weight": (N_VOCAB, n_embd), "output.weight": (N_VOCAB, n_embd)}
    files = {
        "target": header_gguf(d / "target.gguf", "llama", meta=target_meta, tensors=big),
        "mtp": header_gguf(d / "mtp.gguf", "llama", meta={**target_meta, "llama.nextn_predict_layers": 1},
                           tensors=big),
        "small": header_gguf(d / "small.gguf", "llama", meta=target_meta, tensors={"a.weight": (64, 64)}),
        "bigger": header_gguf(d / "bigger.gguf", "llama", meta=target_meta, tensors={"a.weight": (512, 512)}),
        "padded": header_gguf(d / "padded.gguf", "llama", pad=64, meta=target_meta, tensors={"a.weight": (8, 8)}),
        "foreign": header_gguf(d / "foreign.gguf", "llama", extra="x", meta=target_meta,
                               tensors={"a.weight": (8, 8)}),
        "eagle3": header_gguf(d / "eagle3.gguf", "eagle3", name="an EAGLE-3 drafter for tiny-target",
                              meta={"eagle3.target_hidden_size": n_embd, "eagle3.target_layers": [0, 1, 2]},
                              tensors={"fc.weight": (n_embd, 3 * n_embd)}),
        "eagle3_wide": header_gguf(d / "eagle3_wide.gguf", "eagle3",
                                   meta={"eagle3.target_hidden_size": 128, "general.base_model.0.name": "Big-8B"},
                                   tensors={"fc.weight": (128, 384)}),
        "dflash": header_gguf(d / "dflash.gguf", "dflash", meta={"dflash.embedding_length": n_embd,
                                                                 "dflash.target_layers": [0, 1]},
                              tensors={"fc.weight": (n_embd, 2 * n_embd)}),
        "dspark": header_gguf(d / "dspark.gguf", "dflash", meta={"dflash.embedding_length": n_embd},
                              tensors={"fc.weight": (n_embd, 2 * n_embd), "markov_w1.weight": (N_VOCAB, 4)}),
        "deep_head": header_gguf(d / "deep_head.gguf", "eagle3",
                                 meta={"eagle3.target_hidden_size": n_embd, "eagle3.target_layers": [0, 5, 40]},
                                 tensors={"fc.weight": (n_embd, 3 * n_embd)}),
    }
    return {k: M.read_header(p, name=k) for k, p in files.items()}


def test_heads_and_mtp_are_recognised_from_their_headers(heads):
    assert heads["eagle3"].drafter_kind == "eagle3" and heads["eagle3"].drafter_for == "tiny-target"
    assert heads["eagle3_wide"].drafter_for == "Big-8B"
    assert heads["dflash"].drafter_kind == "dflash" and heads["dspark"].drafter_kind == "dspark"
    assert heads["mtp"].mtp and not heads["target"].mtp
    assert heads["target"].n_params == 2 * N_VOCAB * 64  # the two tensors written


def test_drafters_for_ranks_the_fits_and_ends_with_the_spec_types_needing_none(heads):
    fits = M.drafters_for(heads["target"], heads.values())
    named = [f.model.name for f in fits if f.model]
    # not bigger (more parameters), foreign (another vocabulary), eagle3_wide and deep_head (another target's)
    assert set(named) == {"small", "padded", "mtp", "eagle3", "dflash", "dspark"}
    ratios = [f.ratio for f in fits if f.model]
    assert ratios == sorted(ratios)  # smallest first
    assert {f.model.name: f.spec_types for f in fits if f.model} == {
        "small": ("draft-simple",), "padded": ("draft-simple",), "mtp": ("draft-simple",), "eagle3": ("draft-eagle3",),
        "dflash": ("draft-dflash",), "dspark": ("draft-dspark",)}
    assert fits[-1].model is None and fits[-1].spec_types == NO_DRAFTER_SPEC_TYPES
    assert not any("draft-mtp" in f.spec_types for f in fits)
    mtp = M.drafters_for(heads["mtp"], heads.values(), spec_type="draft-mtp")
    assert [(f.model, f.spec_types) for f in mtp] == [(None, ("draft-mtp",))]
    assert [f.model.name for f in M.drafters_for(heads["target"], heads.values(), "draft-dspark")] == ["dspark"]
    assert [f.model for f in M.drafters_for(heads["target"], heads.values(), "ngram-mod")] == [None]


def test_check_drafter_says_why_a_hand_picked_draft_is_refused(heads):
    t = heads["target"]
    assert M.check_drafter(t, heads["small"], "draft-simple") is None
    assert M.check_drafter(t, heads["padded"], "draft-simple") is None  # 64 padding tokens past the end
    why = M.check_drafter(t, heads["foreign"], "draft-simple")
    assert why.startswith("vocabulary mismatch") and t.vocab.digest in why and heads["foreign"].vocab.digest in why
    assert "hidden states 128 wide" in M.check_drafter(t, heads["eagle3_wide"], "draft-eagle3")
    assert "Big-8B" in M.check_drafter(t, heads["eagle3_wide"], "draft-eagle3")
    assert "reads layer 40" in M.check_drafter(t, heads["deep_head"], "draft-eagle3")
    assert "use it with --spec-type draft-eagle3" in M.check_drafter(t, heads["eagle3"], "draft-simple")
    assert "DSpark head (--spec-type draft-dspark)" in M.check_drafter(t, heads["dspark"], "draft-dflash")
    assert "has no MTP heads" in M.check_drafter(t, heads["small"], "draft-mtp")
    assert "drafts from no second model" in M.check_drafter(t, heads["small"], "ngram-simple")


def test_a_vocabulary_more_than_128_apart_is_refused(tmp_path, heads):
    far = M.read_header(header_gguf(tmp_path / "far.gguf", "llama", pad=200), name="far")
    why = M.check_drafter(heads["target"], far, "draft-simple")
    assert why.startswith(f"vocabulary mismatch: {N_VOCAB + 200} tokens against the target's {N_VOCAB}")
