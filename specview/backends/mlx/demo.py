"""Models without a network: the demo model as MLX folders, and random models for tests and benchmarks."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from ...core.errors import ModelFileError, SpecviewError
from .lib import _mx
from .variants import _derive_lock, derive_quantized, mlx_cache_dir


_GGUF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# demo names of the llama.cpp engine -> what the MLX engine uses for them
DEMO_MLX = {
    "Q4_1": (4, 32, "the shipped Q4_1 weights, bit for bit: MLX's affine 4-bit, group 32"),
    "Q4_0": (4, 32, "4-bit, group 32, quantized by mlx_lm.convert from the fp32 copy"),
    "Q4_K_M": (4, 64, "4-bit, group 64, quantized by mlx_lm.convert from the fp32 copy"),
    "Q8_0": (8, 32, "8-bit, group 32, quantized by mlx_lm.convert from the fp32 copy"),
    "F32": (None, None, "fp32, dequantized from the shipped Q4_1"),
    "F16": (None, None, "fp16, cast from the fp32 copy"),
}


def _meta_reader(meta: dict[str, Any]) -> Callable[..., Any]:
    """``m(key, default=None)``: a GGUF metadata value, a one-element array as its Python scalar."""
    def m(key: str, default: Any = None) -> Any:
        v = meta.get(key, default)
        return v.item() if hasattr(v, "item") and getattr(v, "size", 2) == 1 else v
    return m


def _mlx_tensors(weights: dict[str, Any], src_name: str) -> dict[str, Any]:
    """The GGUF's tensors under the names mlx-lm's llama model gives them (each kind: weight, scales, biases)."""
    out_w: dict[str, Any] = {}
    for name, arr in weights.items():
        stem, _, kind = name.rpartition(".")  # kind: weight, scales, biases
        if stem == "token_embd":
            new = "model.embed_tokens"
        elif stem == "output_norm":
            new = "model.norm"
        elif stem == "output":
            new = "lm_head"
        elif stem.startswith("blk."):
            _, layer, part = stem.split(".", 2)
            if part not in _GGUF_NAMES:
                raise SpecviewError(f"{src_name}: unexpected tensor {name}")
            new = f"model.layers.{layer}.{_GGUF_NAMES[part]}"
        else:
            raise SpecviewError(f"{src_name}: unexpected tensor {name}")
        out_w[f"{new}.{kind}"] = arr
    return out_w


def _mlx_config(m: Callable[..., Any], meta: dict[str, Any], out_w: dict[str, Any]) -> dict[str, Any]:
    """config.json of the folder, from the GGUF's llama.* and tokenizer.* metadata (quantization apart)."""
    n_vocab = int(m("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"]))
    return {
        "model_type": "llama",
        "hidden_size": int(m("llama.embedding_length")),
        "num_hidden_layers": int(m("llama.block_count")),
        "intermediate_size": int(m("llama.feed_forward_length")),
        "num_attention_heads": int(m("llama.attention.head_count")),
        "num_key_value_heads": int(m("llama.attention.head_count_kv")),
        "rms_norm_eps": float(m("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(m("llama.rope.freq_base", 10000.0)),
        "rope_traditional": True,
        "vocab_size": n_vocab,
        "max_position_embeddings": int(m("llama.context_length")),
        "tie_word_embeddings": "lm_head.weight" not in out_w,
        "bos_token_id": int(m("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(m("tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",  # norms are f32 in GGUF; what mlx_lm.convert keeps for derived copies
    }


def _quantization(out_w: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's ``quantization`` from the packed weights and their scales; None when no tensor is quantized."""
    # each quantized tensor: packed uint32 rows of in_dims * bits / 32 words, one scale per group
    qparams: dict[str, tuple[int, int]] = {}
    for name, scales in out_w.items():
        if name.endswith(".scales"):
            path = name[: -len(".scales")]
            packed = out_w[f"{path}.weight"]
            for b in (8, 6, 5, 4, 3, 2):  # in_dims = groups * group_size; find the (bits, group) that fit
                words = packed.shape[-1] * 32
                if words % b == 0 and (words // b) % scales.shape[-1] == 0 and (words // b) // scales.shape[-1] in (32, 64, 128):
                    qparams[path] = (b, (words // b) // scales.shape[-1])
                    break
    if not qparams:
        return None
    # the most common setting is the folder's; the others (llama.cpp keeps token_embd at Q8_0) per layer
    (bits, group), _ = collections.Counter(qparams.values()).most_common(1)[0]
    quant: dict[str, Any] = {"group_size": group, "bits": bits}
    for path, (b, g) in sorted(qparams.items()):
        if (b, g) != (bits, group):
            quant[path] = {"group_size": g, "bits": b}
    return quant


def _fast_tokenizer(tokenizers: Any, fast_class: Any, m: Callable[..., Any], meta: dict[str, Any]) -> Any:
    """The GGUF's byte-level BPE (tokens, merges, special tokens, chat template) as a ``PreTrainedTokenizerFast``;
    ``tokenizers`` is the module, ``fast_class`` transformers' class."""
    pre_tokenizers = tokenizers.pre_tokenizers
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(x.split(" ", 1)) for x in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
    pre = m("tokenizer.ggml.pre")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                        if pre == "smollm" else byte_level)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    specials = {k: tokens[int(m(f"tokenizer.ggml.{k}_token_id"))] for k in ("bos", "eos", "padding", "unknown")
                if m(f"tokenizer.ggml.{k}_token_id") is not None}
    fast = fast_class(tokenizer_object=tk, bos_token=specials.get("bos"), eos_token=specials.get("eos"),
                      pad_token=specials.get("padding"), unk_token=specials.get("unknown"))
    template = m("tokenizer.chat_template")
    if template:
        fast.chat_template = str(template)
    return fast


def gguf_to_mlx(gguf: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write a llama-architecture GGUF with a GPT-2 style BPE vocabulary as an MLX model folder.

    MLX reads GGUF tensors itself (Q4_0, Q4_1 and Q8_0 stay quantized, as MLX
    affine quantization with group size 32).  GGUF stores the Q and K
    projections in the interleaved RoPE layout llama.cpp uses, so the folder
    asks for ``rope_traditional`` instead of permuting quantized rows.  The
    tokenizer is rebuilt from the GGUF's tokens, merges and special tokens.
    """
    mx = _mx()
    import tokenizers  # the libraries are imported before the GGUF is read, so a missing one fails first
    from transformers import PreTrainedTokenizerFast
    from mlx_lm.utils import save_config

    src = Path(gguf)
    weights, meta = mx.load(str(src), return_metadata=True)
    m = _meta_reader(meta)
    arch = m("general.architecture")
    if arch != "llama" or m("tokenizer.ggml.model") != "gpt2":
        raise SpecviewError(f"{src.name}: only llama models with a GPT-2 style vocabulary can be converted "
                            f"(this is {arch!r} with a {m('tokenizer.ggml.model')!r} vocabulary)")
    out_w = _mlx_tensors(weights, src.name)
    cfg = _mlx_config(m, meta, out_w)
    quant = _quantization(out_w)
    if quant is not None:
        cfg["quantization"] = quant
    fast = _fast_tokenizer(tokenizers, PreTrainedTokenizerFast, m, meta)
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(dst))
    mx.save_safetensors(str(dst / "model.safetensors"), out_w, metadata={"format": "mlx"})
    save_config(cfg, str(dst / "config.json"))
    return dst


def demo_folder(quant: str, *, cache_dir: str | os.PathLike[str] | None = None,
                progress: Callable[[str], None] | None = None) -> Path:
    """The MLX folder that stands for ``demo:QUANT`` (see :data:`DEMO_MLX`), made on first use.

    The shipped Q4_1 GGUF of SmolLM2-135M-Instruct is converted as it is (its
    4-bit groups of 32 are MLX's own format); an fp32 copy is dequantized from
    it, and the other precisions are made from that copy by mlx_lm.convert
    (fp32 scales and norms keep activations in fp32, which MLX's CPU build runs
    far faster than fp16).  Every folder appears atomically in the cache.
    """
    q = quant.upper()
    if q not in DEMO_MLX:
        raise ModelFileError(f"demo:{quant}: the MLX engine has the demo model as "
                             + ", ".join(f"demo:{k}" for k in DEMO_MLX))
    from ...core import demo

    cdir = mlx_cache_dir(cache_dir)
    base = cdir / "demo-SmolLM2-135M-Instruct-Q4_1"
    with _derive_lock:
        if not (base / "config.json").exists():
            shipped = demo.shipped_path()
            if progress:
                progress(f"converting {shipped.name} to an MLX folder")
            _atomic_folder(base, lambda tmp: gguf_to_mlx(shipped, tmp))
        if q == "Q4_1":
            return base
        from mlx_lm.convert import convert

        fp32 = cdir / "demo-SmolLM2-135M-Instruct-fp32"
        if not (fp32 / "config.json").exists():
            if progress:
                progress("dequantizing the demo model to fp32 with mlx_lm.convert")

            def dequantize(tmp: Path) -> None:
                with contextlib.redirect_stdout(io.StringIO()):
                    convert(str(base), str(tmp), dequantize=True, dtype="float32")

            _atomic_folder(fp32, dequantize)
        if q == "F32":
            return fp32
        if q == "F16":
            fp16 = cdir / "demo-SmolLM2-135M-Instruct-fp16"
            if not (fp16 / "config.json").exists():
                def cast(tmp: Path) -> None:
                    with contextlib.redirect_stdout(io.StringIO()):
                        convert(str(fp32), str(tmp), dtype="float16")

                _atomic_folder(fp16, cast)
            return fp16
    bits, group, _ = DEMO_MLX[q]
    return derive_quantized(fp32, bits, group_size=group, cache_dir=cdir, progress=progress)


def _atomic_folder(dst: Path, make: Callable[[Path], Any]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{threading.get_ident()}.partial"
    try:
        make(tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# -- random models, for tests and benchmarks -------------------------------------------------------
def write_random_model(
    folder: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 2,
    intermediate_size: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    corpus: Sequence[str] | None = None,
    dtype: str = "float32",
    pad_vocab_to: int | None = None,
    tie_embeddings: bool = False,
    arch: str = "llama",
) -> Path:
    """Write an MLX model folder with fixed-seed random weights (llama architecture unless ``arch`` says).

    ``arch`` is one of :data:`RANDOM_ARCHS`: ``llama``; ``lfm2`` (LiquidAI's
    hybrid: short-convolution layers with a recurrent state, then attention,
    alternating, the first layer a convolution); ``qwen3_5`` (gated-delta-net
    recurrent layers and attention, alternating).  The hybrids keep an
    ``ArraysCache`` per recurrent layer, which mlx-lm cannot trim.

    The tokenizer is a byte-level BPE trained on ``corpus`` up to ``vocab_size``
    tokens, with ``<s>`` (BOS, added to plain prompts), ``</s>`` (EOS), ``<pad>``
    and a one-turn chat template.  Two calls with the same corpus give the same
    tokenizer; a different corpus gives a different vocabulary.  Nothing is
    downloaded.  ``pad_vocab_to`` makes the embedding and output head larger than
    the tokenizer (as many real models do), e.g. 49152 rows for a realistic
    output-layer cost in benchmarks.
    """
    mx = _mx()
    from mlx.utils import tree_map
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = list(corpus or [
        "the quick brown fox jumps over the lazy dog. " * 4,
        "speculative decoding drafts a few tokens and the target verifies them in one batch. " * 2,
        "greedy decoding takes the argmax at every position; near ties can flip. ",
    ])
    tk.train_from_iterator(text, trainer)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(str(out))
    n_vocab = max(len(fast), pad_vocab_to or 0)

    if arch not in RANDOM_ARCHS:
        raise SpecviewError(f"write_random_model: architecture {arch!r} is not one of {', '.join(RANDOM_ARCHS)}")
    Model, args, cfg = _random_args(arch, n_vocab=n_vocab, hidden_size=hidden_size, num_layers=num_layers,
                                    intermediate_size=intermediate_size, heads=heads, kv_heads=kv_heads,
                                    tie_embeddings=tie_embeddings)
    mx.random.seed(seed)
    model = Model(args)
    # default init has a tiny output spread; scale so greedy choices are not all near-ties
    model.update(tree_map(lambda a: a * 4.0 if a.ndim == 2 else a, model.parameters()))
    if dtype != "float32":
        model.update(tree_map(lambda a: a.astype(getattr(mx, dtype)), model.parameters()))
    mx.eval(model.parameters())
    save_model(str(out), model)
    cfg["torch_dtype"] = dtype
    cfg["bos_token_id"] = 0
    cfg["eos_token_id"] = 1
    save_config(cfg, str(out / "config.json"))
    return out


#: the architectures :func:`write_random_model` writes
RANDOM_ARCHS = ("llama", "lfm2", "qwen3_5")


def _random_args(arch: str, *, n_vocab: int, hidden_size: int, num_layers: int, intermediate_size: int,
                 heads: int, kv_heads: int, tie_embeddings: bool) -> tuple[Any, Any, dict[str, Any]]:
    """(model class, its args, the config.json dict) of one of :data:`RANDOM_ARCHS`."""
    if arch == "llama":
        from mlx_lm.models.llama import Model, ModelArgs

        args = ModelArgs(model_type="llama", hidden_size=hidden_size, num_hidden_layers=num_layers,
                         intermediate_size=intermediate_size, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, rms_norm_eps=1e-5, vocab_size=n_vocab,
                         tie_word_embeddings=tie_embeddings, max_position_embeddings=4096)
        cfg = {k: v for k, v in dataclasses.asdict(args).items() if v is not None and k != "layer_types"}
        return Model, args, cfg
    if arch == "lfm2":
        from mlx_lm.models.lfm2 import Model, ModelArgs

        layer_types = ["conv" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
        args = ModelArgs(model_type="lfm2", vocab_size=n_vocab, hidden_size=hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=4096, norm_eps=1e-5, conv_bias=False, conv_L_cache=3,
                         block_dim=hidden_size, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                         block_auto_adjust_ff_dim=False, block_ff_dim=intermediate_size, layer_types=layer_types)
        cfg = {k: v for k, v in dataclasses.asdict(args).items() if v is not None}
        return Model, args, cfg
    from mlx_lm.models.qwen3_5 import Model, ModelArgs

    head_dim = hidden_size // heads
    text = {"model_type": "qwen3_5", "hidden_size": hidden_size, "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "rms_norm_eps": 1e-6, "vocab_size": n_vocab, "max_position_embeddings": 4096,
            "linear_num_value_heads": heads, "linear_num_key_heads": kv_heads, "linear_key_head_dim": head_dim,
            "linear_value_head_dim": head_dim, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
            "tie_word_embeddings": tie_embeddings,
            "rope_parameters": {"type": "default", "rope_theta": 100000, "partial_rotary_factor": 0.25}}
    return Model, ModelArgs(model_type="qwen3_5", text_config=dict(text)), dict(text)
