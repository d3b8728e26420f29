"""The MLX engine, over mlx-lm (Apple silicon; ``mlx[cpu]`` on Linux).

* A model is an MLX model folder (``config.json``, ``model*.safetensors``,
  tokenizer files) as ``mlx_lm.convert`` writes it, or a Hugging Face id such as
  ``mlx-community/SmolLM2-135M-Instruct-8bit``, fetched when the user is online,
  or a ``demo:QUANT`` name: the bundled SmolLM2-135M-Instruct GGUF converted to
  MLX on first use (:func:`demo_folder`), so the demo runs without a network.
* Weights are loaded once per folder (:class:`MLXModel`); every arm, drafter and
  replay gets its own KV cache (:class:`MLXEngine`) on the same weights.
* ``eval`` runs ONE forward pass over the new tokens with the engine's prompt
  cache and converts only the logits rows asked for to float32 numpy.  Where
  the model's logits are exactly ``head(inner(x))`` (checked once per model),
  the output head runs only on those rows, so a prefill chunk does not compute
  (chunk x n_vocab) logits only to drop them.
  ``truncate`` trims the cache exactly (``trim_prompt_cache``).  Hybrid and
  recurrent models (lfm2, qwen3_5, mamba2, nemotron_h ...), whose
  ``ArraysCache`` entries mlx-lm cannot trim and on which mlx-lm refuses to
  speculate, roll back by checkpoint and restore (:mod:`.rollback`); a cache
  that allows neither (a full rotating window, an unknown cache class) is
  refused, clearly, naming its classes.
* Quantization flipping: :func:`list_variants` lists the sibling folders of the
  same model (bf16, 8-bit, 4-bit ...) and :func:`derive_quantized` writes a
  quantized copy of a bf16/fp16/fp32 folder with mlx-lm's own converter into
  the user cache folder, atomically.

MLX is imported lazily: importing this package never needs mlx, and
``MLXBackend()`` raises :class:`BackendUnavailable` with the reason when mlx or
mlx-lm cannot be used here.

Threading: MLX streams are per thread.  Each engine owns one
``mx.new_thread_local_stream`` (the same mechanism as mlx-lm's
``generation_stream``) and runs every forward pass inside ``mx.stream(...)``
on it, so an engine works on whichever single thread drives it (the CLI's main
thread, or the GUI's model worker thread) without relying on that thread's
default stream.  On an mlx without thread-local streams the engine makes a plain
stream per calling thread instead.  Results are evaluated (``mx.eval``) before
``eval`` returns; the only work left in flight between calls is the one greedy
step an engine may run ahead (see :class:`MLXEngine`), on the same thread's
stream, so an engine must stay on the thread that uses it, as every engine must.

llama.cpp settings without an MLX meaning (``gpu_layers``, ``threads``,
``flash_attn``, ``n_ubatch``) are ignored.  ``kv_type`` ``f16``/``bf16``/``f32``
keep the KV cache in the model's dtype; ``q8_0``, ``q5_*`` and ``q4_*`` use
mlx-lm's quantized KV cache with 8, 5 or 4 bits from the first token on.
The package, by concern: ``lib`` (the import guard, environment, token
pieces), ``folders`` (what a model folder holds), ``engine`` (the model and its
KV caches), ``rollback`` (checkpoints, restores and replays for caches mlx-lm
cannot trim), ``variants`` (quantization flipping), ``demo`` (the demo model and
random models) and ``backend`` (what the registry loads).
"""

from __future__ import annotations

from .backend import MLXBackend, MLXLoaded
from .demo import DEMO_MLX, demo_folder, gguf_to_mlx, write_random_model
from .engine import MLXEngine, MLXModel
from .folders import check_model_folder, display_name, folder_dtype, folder_quantization, folder_size
from .lib import INSTALL_HINT, mlx_environment
from .variants import (
    SOURCE_FILE,
    MLXDerivable,
    MLXVariant,
    base_name,
    derivable_variants,
    derive_quantized,
    list_variants,
    mlx_cache_dir,
)

__all__ = [
    "MLXBackend",
    "MLXEngine",
    "MLXLoaded",
    "MLXModel",
    "MLXVariant",
    "MLXDerivable",
    "derivable_variants",
    "derive_quantized",
    "list_variants",
    "folder_quantization",
    "display_name",
    "demo_folder",
    "gguf_to_mlx",
    "write_random_model",
    "DEMO_MLX",
    "INSTALL_HINT",
    "SOURCE_FILE",
    "base_name",
    "check_model_folder",
    "folder_dtype",
    "folder_size",
    "mlx_cache_dir",
    "mlx_environment",
]
