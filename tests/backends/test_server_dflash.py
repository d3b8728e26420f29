"""draft-dflash and draft-dspark through llama-server, with tiny random-weight drafters written for the demo target.

The drafters (``tiny_drafters.dflash.write_dflash``) are llama.cpp's ``dflash``
architecture: ``fc`` over three of the target's layer inputs and one
non-causal decoder layer that fills a block of mask tokens in one pass,
sharing the target's token embeddings and lm_head; the DSpark one adds the
Markov head that makes llama.cpp treat it as DSpark.  Their weights are random,
so the target rejects nearly every drafted token; what is checked is that
llama-server loads and drafts with them, that the draft length is what
llama.cpp caps it to, that specview's per-round record adds up to the server's
totals, that both arms stay the target's greedy decoding, and that llama.cpp
refuses ``--spec-draft-p-min`` > 0 exactly where ``dspark_p_min_refusal`` says.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import door
import pytest
from test_server import find_binary, runner  # noqa: F401  (runner: one ServerRunner for the module)

from specview.backends.llama_cpp.tiny_drafters import common, dflash
from specview.backends.llama_server import ServerRunner
from specview.core.config import EngineSettings, RunConfig

pytestmark = [pytest.mark.demo, pytest.mark.slow]

N_TOKENS = 48
PROMPT = "The three primary colours are"
KIND = {"draft-dflash": "DFlash", "draft-dspark": "DSpark"}


@pytest.fixture(scope="module")
def target() -> Path:
    from specview.backends.llama_cpp.demo import resolve

    return Path(resolve("demo:Q8_0"))


@pytest.fixture(scope="module")
def facts(target) -> common.TargetFacts:
    return common.read_target(target)  # read once for every drafter written here (a second or two)


@pytest.fixture(scope="module")
def drafters(facts, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dflash")
    return {
        "draft-dflash": dflash.write_dflash(facts, d / "tiny-dflash.gguf"),
        "draft-dspark": dflash.write_dflash(facts, d / "tiny-dspark.gguf", dspark=True),
        "dspark-confidence": dflash.write_dflash(facts, d / "tiny-dspark-conf.gguf", dspark=True,
                                                 confidence_head=True),
        "draft-dflash-b4": dflash.write_dflash(facts, d / "tiny-dflash-b4.gguf", block_size=4),
        "draft-dspark-b4": dflash.write_dflash(facts, d / "tiny-dspark-b4.gguf", dspark=True, block_size=4),
    }


@functools.cache
def fields(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    out = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    out["tensors"] = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    return out


@pytest.mark.parametrize("spec_type", ["draft-dflash", "draft-dspark"])
def test_the_drafter_is_a_dflash_model_shaped_for_its_target(target, drafters, spec_type):
    path = drafters[spec_type]
    d, t = fields(path), fields(target)
    arch = t["general.architecture"]
    n_embd, n_layer, n_vocab = t[f"{arch}.embedding_length"], t[f"{arch}.block_count"], len(t["tokenizer.ggml.tokens"])
    assert d["general.architecture"] == "dflash" and d["dflash.block_count"] == 1
    assert d["general.name"] == f"specview tiny random {KIND[spec_type]} drafter for {target.name}"
    layers = d["dflash.target_layers"]
    assert len(layers) == 3 and layers == sorted(set(layers)) and all(0 <= i < n_layer for i in layers), layers
    # the target's token embeddings and lm_head are shared (ctx_other), so the drafter is as wide as the target
    assert "token_embd.weight" not in d["tensors"] and "output.weight" not in d["tensors"] and "d2t" not in d["tensors"]
    assert d["dflash.embedding_length"] == n_embd
    assert d["tensors"]["fc.weight"] == [3 * n_embd, n_embd]
    assert d["dflash.attention.key_length"] == d["dflash.attention.value_length"]
    assert d["dflash.block_size"] == dflash.BLOCK_SIZE
    # the target's tokenizer, verbatim, plus the mask token the block is filled with
    tok = {k: v for k, v in d.items() if k.startswith("tokenizer.")}
    assert tok.pop("tokenizer.ggml.mask_token_id") in range(n_vocab)
    assert tok == {k: v for k, v in t.items() if k.startswith("tokenizer.")}
    # the Markov head, and the anchor-first layout with no confidence head, exactly for DSpark
    markov = {k: v for k, v in d["tensors"].items() if k.startswith("markov_")}
    conf = {k: v for k, v in d.items() if k in ("dflash.sample_from_anchor", "dflash.has_confidence_head")}
    if spec_type == "draft-dspark":
        assert markov == {"markov_w1.weight": [dflash.MARKOV_RANK, n_vocab],
                          "markov_w2.weight": [dflash.MARKOV_RANK, n_vocab]}
        assert conf == {"dflash.sample_from_anchor": True, "dflash.has_confidence_head": False}
    else:
        assert markov == {} and conf == {}
    assert not any(k.startswith("conf_proj") for k in d["tensors"])
    # the quick header scan dspark_p_min_refusal uses reads what gguf reads
    kv, names = dflash.scan_header(path)
    assert names == set(d["tensors"])
    assert kv == {k: v for k, v in d.items() if k != "tensors" and not isinstance(v, list)}  # arrays skipped


def _engine() -> EngineSettings:
    # one thread unless $SPECVIEW_THREADS says otherwise (threads=0 reads it)
    return EngineSettings(threads=0 if os.environ.get("SPECVIEW_THREADS") else 1, n_ctx=512, server_bin=find_binary())


def _config(target: Path, draft: Path | None, spec_type: str, n_max: int = 3) -> RunConfig:
    return RunConfig(target=str(target), draft=str(draft) if draft else None, spec_type=spec_type, n_max=n_max,
                     max_tokens=N_TOKENS, prompt=PROMPT, chat=False, ignore_eos=True, engine=_engine(),
                     backend="llama-server")


@pytest.fixture(scope="module")
def plain(target):
    """The target's greedy decoding on a server with no drafter at all."""
    with ServerRunner(single_server=False) as r:
        return r.run(_config(target, None, "none"))


# (spec type, drafter, n_max, the longest draft llama.cpp lets it make): it clamps n_max to the trained block,
# block_size - 1 for DFlash (the anchor takes a slot) and block_size for anchor-first DSpark
CASES = [("draft-dflash", "draft-dflash", 3, 3), ("draft-dspark", "draft-dspark", 7, 7),
         ("draft-dflash", "draft-dflash-b4", 7, 3), ("draft-dspark", "draft-dspark-b4", 7, 4)]


@pytest.mark.parametrize("spec_type,drafter,n_max,cap", CASES, ids=[f"{c[1]}-n{c[2]}" for c in CASES])
def test_llama_server_drafts_blocks_with_it_and_the_rounds_add_up(runner, plain, target, drafters, spec_type,
                                                                  drafter, n_max, cap):
    path = drafters[drafter]
    t = runner.run(_config(target, path, spec_type, n_max))
    rec = t.extra["server"]
    args = rec["speculative"]["server"]["args"]
    assert args[args.index("--spec-type") + 1] == spec_type
    assert args[args.index("-md") + 1] == str(path)
    assert args[args.index("--spec-draft-n-max") + 1] == str(n_max)
    s = t.speculative
    assert s.n_drafted > 0  # the server fed the target's layers to the drafter and drafted from its block
    assert rec["speculative"]["rounds"]["available"], rec["speculative"]["rounds"]
    assert sum(r.drafted for r in s.rounds) == s.n_drafted == s.reported_drafted
    assert sum(r.accepted for r in s.rounds) == s.reported_accepted
    assert 1 + sum(r.accepted + 1 for r in s.rounds[1:]) == len(s.tokens) == N_TOKENS
    assert all(0 <= r.accepted <= r.drafted <= cap for r in s.rounds)
    # a block drafter fills its whole (clamped) block every round while enough tokens are left
    assert max(r.drafted for r in s.rounds) == cap
    # the single-server premise: with the drafter loaded, vanilla is what a server without it decodes
    assert rec["protocol"] == "single-server" and rec["vanilla"]["check"]["identical"], rec.get("protocol_reason")
    assert t.vanilla.tokens == plain.vanilla.tokens and len(t.vanilla.tokens) == N_TOKENS
    # a verify pass is 1 + n_drafted rows wide; the quantized target's batched kernels may round differently from a
    # one-token pass, which can flip vanilla's choice only where its top two log-probabilities nearly tie, and then to
    # the runner-up; a drafted token taken unverified or a wrong position moves far more than that
    if not t.comparison.identical:
        fm = t.comparison.first_mismatch
        st = t.vanilla.steps[fm.index]
        assert st.margin is not None and st.margin < 0.1 and fm.speculative_token == st.top_ids[1], \
            (fm, st.top_ids[:2], st.margin)


def test_dspark_p_min_refusal_is_what_llama_server_does(target, drafters):
    from specview.backends.llama_server.process import LlamaServer
    from specview.backends.llama_server.protocol import completion_body

    no_conf, conf, plain_dflash = drafters["draft-dspark"], drafters["dspark-confidence"], drafters["draft-dflash"]
    reason = dflash.dspark_p_min_refusal(no_conf)
    assert reason == "DSpark draft has no confidence head: please set --spec-draft-p-min 0"
    assert dflash.dspark_p_min_refusal(no_conf, spec_type=None) == reason  # the server detects DSpark by markov_w1
    assert dflash.dspark_p_min_refusal(no_conf, spec_type="draft-dflash") is None  # DFlash cuts by probability
    assert dflash.dspark_p_min_refusal(conf) is None
    # no dflash.has_confidence_head key at all counts as having one
    assert "dflash.has_confidence_head" not in fields(plain_dflash)
    assert dflash.dspark_p_min_refusal(plain_dflash) is None
    assert dflash.dspark_p_min_refusal(target) is None  # not a dflash file

    threads = os.environ.get("SPECVIEW_THREADS") or "1"
    cases = [(no_conf, ["--spec-type", "draft-dspark"]), (no_conf, []), (conf, ["--spec-type", "draft-dspark"]),
             (plain_dflash, ["--spec-type", "draft-dspark"])]
    for draft, spec in cases:
        expected = dflash.dspark_p_min_refusal(draft, spec_type=spec[1] if spec else None)
        args = ["-m", str(target), "-md", str(draft), *spec, "--spec-draft-n-max", "7", "--spec-draft-p-min", "0.5",
                "-c", "512", "-np", "1", "-t", threads, *door.server_flags()]
        with LlamaServer(find_binary(), args, label="p-min") as srv:
            srv.wait_ready(timeout=120)
            resp = srv.post("/completion", completion_body([1, 504, 3458, 282, 4998], 8, n_probs=0))
            log = srv.log_text()
            assert srv.alive()  # refused or not, the server serves
        assert len(resp["tokens"]) == 8
        refusal = f"failed to initialize speculative decoding context: {reason}"
        if expected:
            # the server says why, drops speculative decoding and decodes plainly
            assert refusal in log and "adding speculative implementation" not in log, (spec, log[-2000:])
            assert not resp["timings"].get("draft_n")
        else:
            assert refusal not in log and "adding speculative implementation 'draft-dspark'" in log, (spec, log[-2000:])
            assert "p_min=0.50" in log
