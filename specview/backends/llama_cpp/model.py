"""One GGUF file's weights (or only its vocabulary), loaded once and shared by every context."""

from __future__ import annotations

import ctypes
import re
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from ...core import activity
from ...core.engine import VocabInfo
from ...core.errors import ModelFileError, SpecviewError
from .lib import _init, clear_log, log_lines, recent_log, take_repack_lines
from .plant import check_repacked_load

GGUF_MAGIC = b"GGUF"
_VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}

_QUANT_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}
QUANT_FTYPES = {v: k for k, v in _QUANT_NAMES.items()}


def quant_name(ftype: str | int | None) -> str | None:
    if ftype is None:
        return None
    try:
        return _QUANT_NAMES.get(int(ftype), f"ftype {ftype}")
    except ValueError:
        return str(ftype)


def check_gguf_file(path: Path) -> None:
    """Fail early, with a specific message, on a path that cannot be a GGUF model."""
    if not path.exists():
        raise ModelFileError(f"{path}: no such file. Check the path, or run `specview models` to list the demo models.")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a folder; give the path of a .gguf file inside it")
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{path}: not a GGUF model file (it starts with {magic!r}, a GGUF file starts with b'GGUF'). "
            "Convert it with llama.cpp's convert_hf_to_gguf.py, or pick another file."
        )
    if size < 32:
        raise ModelFileError(
            f"{path}: a GGUF file cut short ({size} bytes, less than its header alone); "
            "download or copy it again, or pick another file."
        )


def _utf8(text: str) -> bytes:
    """The prompt as UTF-8, or a clear error for text that has no UTF-8 form (a lone surrogate)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SpecviewError(
            f"the prompt is not valid Unicode text (character {exc.start} is a lone surrogate, "
            f"{text[exc.start]!r}); give it as UTF-8 text, or as token ids with --tokens"
        ) from None


_ASSIGNED = re.compile(r"layer\s+\d+\s+assigned to device\s+(\S+?),")


def layer_placement(lines: list[str]) -> dict[str, int]:
    """How many layers llama.cpp put on each device, from its load log ("layer 3 assigned to device CPU, ...")."""
    out: dict[str, int] = {}
    for ln in lines:
        m = _ASSIGNED.search(ln)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


_BUFFER = re.compile(r"(\S+) model buffer size\s*=\s*([0-9.]+) MiB")


def weight_buffers(lines: list[str]) -> dict[str, float]:
    """The buffers llama.cpp put the weights in, MiB each, from its load log ("CPU_REPACK model buffer size =
    56.95 MiB"): ``CPU_REPACK`` and ``AMX`` are the repacked layouts, ``CPU`` the plain one."""
    out: dict[str, float] = {}
    for ln in lines:
        m = _BUFFER.search(ln)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


class LlamaModel:
    """One GGUF file's weights, loaded once.

    With ``vocab_only`` only the vocabulary and the metadata are read (no
    weights, no contexts): enough to tokenize, detokenize and describe a model
    that runs elsewhere (llama-server).  ``no_repack`` keeps the weights in the
    plain CPU buffer (``use_extra_bufts = false``, llama.cpp's ``--no-repack``):
    no repacked or AMX layouts, so batched passes take other kernels.
    ``no_host`` skips a GPU's pinned host buffer (llama.cpp's ``--no-host``), which
    llama.cpp otherwise prefers for the CPU's weights whenever a GPU is visible,
    so that the repacked buffers are used even then.
    """

    def __init__(self, path: str | os.PathLike[str], *, gpu_layers: int = -1, vocab_only: bool = False,
                 no_repack: bool = False, no_host: bool = False):
        self.path = Path(path).expanduser().resolve()
        check_gguf_file(self.path)
        ll = _init()
        self._ll = ll
        self.vocab_only = vocab_only
        self.gpu_layers = 0 if vocab_only else gpu_layers
        self.no_repack = bool(no_repack)
        mp = ll.llama_model_default_params()
        mp.vocab_only = vocab_only
        mp.use_extra_bufts = not self.no_repack
        if no_host and hasattr(mp, "no_host"):  # llama.cpp's llama_model_params has had it since 2025
            mp.no_host = True
        mp.n_gpu_layers = 0 if vocab_only else (gpu_layers if gpu_layers >= 0 else 999)
        if activity.active:  # a long load is progress too: the worker's deadline must not read it as a hang
            name = self.path.name

            def loading(progress: float, _ud: Any) -> bool:
                activity.doing(f"loading {name} ({progress:.0%})")
                return True

            self._progress_cb = ll.llama_progress_callback(loading)
            mp.progress_callback = self._progress_cb
        clear_log()
        t0 = time.perf_counter()
        model = ll.llama_model_load_from_file(str(self.path).encode("utf-8"), mp)
        if not model:
            what = "read this model's vocabulary" if vocab_only else "load this model"
            raise ModelFileError(
                f"{self.path}: llama.cpp could not {what} (corrupt, truncated, or an architecture "
                f"this llama.cpp build does not know).\nllama.cpp said:\n{recent_log(6)}"
            )
        self.load_seconds = time.perf_counter() - t0
        load_log = log_lines()
        self.layer_devices = layer_placement(load_log)
        self.weight_buffers = weight_buffers(load_log)
        take_repack_lines()  # this load's are checked here, not by whoever asks next
        if not vocab_only:
            try:
                check_repacked_load(self.path, load_log)
            except SpecviewError:
                ll.llama_model_free(model)
                raise
        self.ptr = model
        self.vocab_ptr = ll.llama_model_get_vocab(model)
        self._vocab: VocabInfo | None = None
        self._pieces: dict[int, str] = {}
        self.n_ctx_train = ll.llama_model_n_ctx_train(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab_ptr)
        self.contexts = 0

    # -- facts -----------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = self._ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        return buf.value.decode("utf-8", "replace")

    def facts(self) -> dict[str, Any]:
        ll = self._ll
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.ptr, desc, len(desc))
        ftype = self.meta("general.file_type")
        return {
            "path": str(self.path),
            "file": self.path.name,
            "file_size": self.path.stat().st_size,
            "backend": "llama.cpp",
            "architecture": self.meta("general.architecture"),
            "name": self.meta("general.name"),
            "description": desc.value.decode("utf-8", "replace"),
            "quantization": quant_name(ftype),
            "file_type": int(ftype) if ftype and ftype.isdigit() else None,
            "n_params": int(ll.llama_model_n_params(self.ptr)),
            "n_vocab": self.n_vocab,
            "vocab_type": self.vocab.vocab_type,
            "vocab_fingerprint": self.vocab.fingerprint(),
            "n_ctx_train": self.n_ctx_train,
            "gpu_layers": self.gpu_layers,
            "no_repack": self.no_repack,
            "layers_on": dict(self.layer_devices),
            # where the weights live, MiB each: CPU_REPACK / AMX are repacked layouts, whose batched kernels differ
            "weight_buffers": {k: round(v, 2) for k, v in self.weight_buffers.items()},
            "load_seconds": round(self.load_seconds, 3),
        }

    @property
    def vocab(self) -> VocabInfo:
        if self._vocab is None:
            ll, v = self._ll, self.vocab_ptr
            n = self.n_vocab
            texts = tuple((ll.llama_vocab_get_text(v, i) or b"").decode("utf-8", "surrogateescape") for i in range(n))
            eog = frozenset(i for i in range(n) if ll.llama_vocab_is_eog(v, i))

            def tok(x: int) -> int | None:
                return None if x < 0 else int(x)

            self._vocab = VocabInfo(
                n_vocab=n,
                vocab_type=_VOCAB_TYPES.get(ll.llama_vocab_type(v), str(ll.llama_vocab_type(v))),
                bos=tok(ll.llama_vocab_bos(v)),
                eos=tok(ll.llama_vocab_eos(v)),
                add_bos=bool(ll.llama_vocab_get_add_bos(v)),
                add_eos=bool(ll.llama_vocab_get_add_eos(v)),
                eog=eog,
                texts=texts,
            )
        return self._vocab

    # -- text ------------------------------------------------------------------
    @property
    def chat_template(self) -> bytes | None:
        """The GGUF's ``tokenizer.chat_template``, or None when the file has none."""
        return self._ll.llama_model_chat_template(self.ptr, None) or None

    @property
    def chat_note(self) -> str | None:
        """How a chat prompt is fed to this model when it has no chat template (None when it has one).

        llama.cpp's own tools do the same: llama-completion turns conversation
        mode off for a model without a template and feeds the prompt as it is.
        """
        if self.chat_template:
            return None
        return (f"{self.path.name} has no chat template, so the prompt is fed as plain text "
                "(as llama.cpp's llama-completion does for such a model)")

    def apply_chat_template(self, user_text: str) -> str:
        """``user_text`` as one user turn in the model's template; the text itself when it has none."""
        ll = self._ll
        tmpl = self.chat_template
        if not tmpl:
            return user_text
        msgs = (ll.llama_chat_message * 1)()
        content = _utf8(user_text)
        msgs[0].role = b"user"
        msgs[0].content = content
        size = max(1024, 4 * len(content) + 512)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_chat_apply_template(tmpl, msgs, 1, True, buf, size)
            if n < 0:
                raise SpecviewError(
                    f"{self.path.name}: llama.cpp does not recognise this model's chat template; "
                    "run with --no-chat and pass the already formatted prompt"
                )
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise SpecviewError("chat template output did not fit")  # pragma: no cover

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of ``text``; with ``chat`` it is wrapped as one user turn (special tokens parsed).

        A model without a chat template tokenizes a chat prompt exactly as plain
        text (see :attr:`chat_note`).
        """
        ll = self._ll
        special = bool(chat and self.chat_template)
        if special:
            text = self.apply_chat_template(text)
        data = _utf8(text)
        cap = len(data) + 16
        arr = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab_ptr, data, len(data), arr, cap, True, special)
        if n < 0:
            cap = -n
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab_ptr, data, len(data), arr, cap, True, special)
        return list(arr[:n])

    def piece(self, token: int) -> str:
        p = self._pieces.get(token)
        if p is None:
            p = self.piece_bytes(token).decode("utf-8", "replace")
            self._pieces[token] = p
        return p

    def piece_bytes(self, token: int) -> bytes:
        ll = self._ll
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab_ptr, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab_ptr, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece_bytes(t) for t in tokens).decode("utf-8", "replace")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self._ll.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def vocab_model(path: str | os.PathLike[str]) -> LlamaModel:
    """A :class:`LlamaModel` with only the vocabulary and metadata of ``path`` read (no weights)."""
    return LlamaModel(path, vocab_only=True)


def has_mtp_heads(target: str | os.PathLike[str]) -> bool:
    """Whether a GGUF file carries multi-token-prediction layers (``ARCH.nextn_predict_layers`` > 0), from its
    header; a demo name, or a file that cannot be read, has none."""
    from ...core.demo import is_demo_name
    from ...core.models import is_store_name, resolve_name

    if is_demo_name(str(target)):
        return False  # SmolLM2 has none
    if is_store_name(str(target)):
        try:
            return resolve_name(str(target), "gguf").mtp
        except SpecviewError:
            return False
    try:
        m = vocab_model(target)
        try:
            arch = m.meta("general.architecture") or ""
            n = m.meta(f"{arch}.nextn_predict_layers")
        finally:
            m.close()
        return bool(n) and int(n) > 0
    except (SpecviewError, ValueError):
        return False


class ModelStore:
    """Loads each (file, GPU layers, no repack) once and hands out the shared weights.

    ``loads`` counts real loads, so tests and the matrix can prove a file was
    loaded exactly once.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int, bool], LlamaModel] = {}
        self.loads = 0
        self._lock = threading.Lock()

    def get(self, path: str | os.PathLike[str], *, gpu_layers: int = -1, no_repack: bool = False) -> LlamaModel:
        key = (str(Path(path).expanduser().resolve()), gpu_layers, bool(no_repack))
        with self._lock:
            m = self._models.get(key)
            if m is None:
                m = LlamaModel(path, gpu_layers=gpu_layers, no_repack=no_repack)
                self._models[key] = m
                self.loads += 1
            return m

    def loaded(self) -> list[LlamaModel]:
        return list(self._models.values())

    def close(self) -> None:
        with self._lock:
            for m in self._models.values():
                m.close()
            self._models.clear()
