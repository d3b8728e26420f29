"""The llama.cpp engine, over llama-cpp-python's low-level C API.

* Weights are loaded once per file (:class:`LlamaModel`, shared through
  :class:`ModelStore`); every arm, drafter and replay gets its own context
  (:class:`LlamaEngine`) on the same weights.
* Logits are requested only for the rows asked for, so memory is
  O(n_vocab x n_batch), never O(n_ctx x n_vocab).
* llama.cpp's log goes into a ring buffer; when a load fails its last lines
  explain why, in the error message.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.engine import (
    BackendUnavailable,
    Engine,
    EngineSettings,
    EvalError,
    ModelFileError,
    SpecviewError,
    VocabInfo,
)

_VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}
_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
_FLASH = {"auto": -1, "off": 0, "on": 1}
GGUF_MAGIC = b"GGUF"

_lock = threading.Lock()
_initialised = False
_log_lines: collections.deque[str] = collections.deque(maxlen=200)
_log_cb = None  # keep the ctypes callback alive


def _lib():
    """Import llama_cpp, or say plainly why it cannot be used."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:  # ImportError, OSError from a broken shared library, ...
        raise BackendUnavailable(
            f"llama-cpp-python is not usable here ({type(exc).__name__}: {exc}). "
            "Install it with `pip install llama-cpp-python` (see the README for GPU builds)."
        ) from exc
    return llama_cpp


def _init() -> Any:
    global _initialised, _log_cb
    ll = _lib()
    with _lock:
        if not _initialised:
            @ll.llama_log_callback
            def _cb(level, text, user_data):  # pragma: no cover - called from C
                try:
                    _log_lines.append(text.decode("utf-8", "replace"))
                except Exception:
                    pass

            _log_cb = _cb
            ll.llama_log_set(_log_cb, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True
    return ll


def recent_log(n: int = 8) -> str:
    lines = "".join(_log_lines).strip().splitlines()
    return "\n".join(lines[-n:])


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
    if size < 32 or magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{path}: not a GGUF model file (it starts with {magic!r}, a GGUF file starts with b'GGUF'). "
            "Convert it with llama.cpp's convert_hf_to_gguf.py, or pick another file."
        )


class LlamaModel:
    """One GGUF file's weights, loaded once."""

    def __init__(self, path: str | os.PathLike[str], *, gpu_layers: int = -1):
        self.path = Path(path).expanduser().resolve()
        check_gguf_file(self.path)
        ll = _init()
        self._ll = ll
        self.gpu_layers = gpu_layers
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = gpu_layers if gpu_layers >= 0 else 999
        _log_lines.clear()
        t0 = time.perf_counter()
        model = ll.llama_model_load_from_file(str(self.path).encode("utf-8"), mp)
        if not model:
            why = recent_log(6)
            raise ModelFileError(
                f"{self.path}: llama.cpp could not load this model (corrupt, truncated, or an architecture "
                f"this llama.cpp build does not know).\nllama.cpp said:\n{why}"
            )
        self.load_seconds = time.perf_counter() - t0
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
    def apply_chat_template(self, user_text: str) -> str:
        ll = self._ll
        tmpl = ll.llama_model_chat_template(self.ptr, None)
        if not tmpl:
            raise SpecviewError(
                f"{self.path.name} has no chat template; run without --chat to feed the prompt as plain text"
            )
        msgs = (ll.llama_chat_message * 1)()
        msgs[0].role = b"user"
        msgs[0].content = user_text.encode("utf-8")
        size = max(1024, 4 * len(msgs[0].content) + 512)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_chat_apply_template(tmpl, msgs, 1, True, buf, size)
            if n < 0:
                raise SpecviewError(
                    f"{self.path.name}: llama.cpp does not recognise this model's chat template; "
                    "run without --chat, or pass the already formatted prompt"
                )
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise SpecviewError("chat template output did not fit")  # pragma: no cover

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        ll = self._ll
        if chat:
            text = self.apply_chat_template(text)
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab_ptr, data, len(data), arr, cap, True, chat)
        if n < 0:
            cap = -n
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab_ptr, data, len(data), arr, cap, True, chat)
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


class ModelStore:
    """Loads each (file, GPU layers) once and hands out the shared weights.

    ``loads`` counts real loads, so tests and the matrix can prove a file was
    loaded exactly once.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int], LlamaModel] = {}
        self.loads = 0
        self._lock = threading.Lock()

    def get(self, path: str | os.PathLike[str], *, gpu_layers: int = -1) -> LlamaModel:
        key = (str(Path(path).expanduser().resolve()), gpu_layers)
        with self._lock:
            m = self._models.get(key)
            if m is None:
                m = LlamaModel(path, gpu_layers=gpu_layers)
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


class LlamaEngine(Engine):
    """One llama.cpp context on a shared :class:`LlamaModel`."""

    backend = "llama.cpp"

    def __init__(self, model: LlamaModel, settings: EngineSettings = EngineSettings(), *, n_ctx: int | None = None):
        super().__init__()
        ll = model._ll
        self._ll = ll
        self.model = model
        self.settings = settings
        n_ctx = n_ctx or settings.n_ctx or 4096
        if settings.flash_attn not in _FLASH:
            raise SpecviewError(f"flash attention must be one of auto, on, off (got {settings.flash_attn!r})")
        if settings.kv_type.lower() not in _KV_TYPES:
            raise SpecviewError(
                f"KV cache type {settings.kv_type!r} is not one of {', '.join(_KV_TYPES)}"
            )
        cp = ll.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = settings.n_batch
        cp.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        cp.n_seq_max = 1
        threads = settings.threads or default_threads()
        self.threads = threads  # what the run really used: the thread count can move the logits
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = _FLASH[settings.flash_attn]
        kv = _KV_TYPES[settings.kv_type.lower()]
        cp.type_k = kv
        cp.type_v = kv
        cp.no_perf = True
        _log_lines.clear()
        ctx = ll.llama_init_from_model(model.ptr, cp)
        if not ctx:
            raise SpecviewError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name} "
                f"(out of memory, or settings this build does not support).\nllama.cpp said:\n{recent_log(6)}"
            )
        self.ctx = ctx
        self.mem = ll.llama_get_memory(ctx)
        self._n_ctx = ll.llama_n_ctx(ctx)
        self._n_batch = settings.n_batch
        self._batch = ll.llama_batch_init(self._n_batch, 0, 1)
        self._n_vocab = model.n_vocab
        model.contexts += 1

    # -- facts -----------------------------------------------------------------
    @property
    def vocab(self) -> VocabInfo:
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def model_facts(self) -> dict[str, Any]:
        return self.model.facts()

    def environment(self) -> dict[str, Any]:
        return llama_environment()

    # -- text ------------------------------------------------------------------
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.model.tokenize(text, chat=chat)

    def piece(self, token: int) -> str:
        return self.model.piece(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens)

    # -- evaluation ------------------------------------------------------------
    def eval(self, tokens: Sequence[int], rows: Sequence[int]) -> np.ndarray:
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        if n > self._n_batch:
            raise ValueError(f"{n} tokens exceed n_batch={self._n_batch}; chunk them")
        if self.n_past + n > self._n_ctx:
            raise EvalError(
                f"the context is full ({self.n_past} + {n} > n_ctx {self._n_ctx}); raise --n-ctx"
            )
        ll = self._ll
        b = self._batch
        rows = [r + n if r < 0 else r for r in rows]
        want = set(rows)
        pos0 = self.n_past
        n_vocab = self._n_vocab
        for i, t in enumerate(tokens):
            if not 0 <= t < n_vocab:
                raise EvalError(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i in want else 0
        b.n_tokens = n
        t0 = time.perf_counter()
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            self.eval_seconds += time.perf_counter() - t0
            raise EvalError(f"llama_decode failed with status {rc} at position {pos0} ({n} tokens)")
        out = np.empty((len(rows), n_vocab), dtype=np.float32)
        for j, r in enumerate(rows):
            ptr = ll.llama_get_logits_ith(self.ctx, r)
            ctypes.memmove(out[j].ctypes.data, ptr, n_vocab * 4)
        self.eval_seconds += time.perf_counter() - t0
        self.n_evals += 1
        self.n_past = pos0 + n
        return out

    def truncate(self, n: int) -> None:
        if n < 0 or n > self.n_past:
            raise ValueError(f"cannot truncate to {n}: the context holds {self.n_past} tokens")
        if n < self.n_past:
            if not self._ll.llama_memory_seq_rm(self.mem, 0, n, -1):
                raise EvalError(f"llama.cpp refused to remove KV positions >= {n} (this model's memory cannot roll back)")
        self.n_past = n

    def sibling(self, *, n_ctx: int | None = None) -> "LlamaEngine":
        return LlamaEngine(self.model, self.settings, n_ctx=n_ctx or self._n_ctx)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self.ctx)
            self.ctx = None
            self.model.contexts -= 1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


_ENV: dict[str, Any] | None = None


def default_threads() -> int:
    """Threads when --threads is 0: $SPECVIEW_THREADS if set, else every core.

    llama.cpp's worker threads spin at barriers, so on a busy machine fewer
    threads than cores can be much faster; the variable lets a user (or a
    shared build machine) say so once.
    """
    env = os.environ.get("SPECVIEW_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, os.cpu_count() or 1)


def ggml_devices() -> list[dict[str, str]]:
    """The ggml backend devices this llama.cpp build sees (CPU, Vulkan0, ROCm0, Metal, CUDA0...)."""
    ll = _init()
    libdir = Path(ll.__file__).parent / "lib"
    # the device registry lives in libggml; dlsym on it also finds libggml-base's functions
    names = ["libggml.so", "libggml.dylib", "ggml.dll", "libggml-base.so", "libggml-base.dylib"]
    lib = None
    for name in names:
        p = libdir / name
        if p.exists():
            try:
                lib = ctypes.CDLL(str(p))
                break
            except OSError:
                continue
    if lib is None or not hasattr(lib, "ggml_backend_dev_count"):
        return []
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        out.append({
            "name": (lib.ggml_backend_dev_name(d) or b"").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(d) or b"").decode("utf-8", "replace"),
        })
    return out


def llama_environment() -> dict[str, Any]:
    global _ENV
    if _ENV is None:
        ll = _init()
        try:
            sysinfo = ll.llama_print_system_info().decode("utf-8", "replace").strip()
        except Exception:
            sysinfo = None
        try:
            devices = ggml_devices()
        except Exception:
            devices = []
        _ENV = {
            "llama_cpp_python": getattr(ll, "__version__", None),
            "llama_cpp_system_info": sysinfo,
            "ggml_devices": devices,
            "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        }
    return dict(_ENV)


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], quant: str, *, threads: int = 0) -> Path:
    """Write ``dst`` as ``quant`` from ``src`` with llama.cpp's own quantizer (requantizing allowed).

    The file appears atomically: a reader sees no file or the whole file.
    """
    ll = _init()
    q = quant.upper()
    if q not in QUANT_FTYPES:
        raise SpecviewError(f"unknown quantization {quant!r}; known: {', '.join(sorted(QUANT_FTYPES))}")
    src_p = Path(src)
    check_gguf_file(src_p)
    dst_p = Path(dst)
    tmp = dst_p.with_name(f".{dst_p.name}.{os.getpid()}.partial")
    params = ll.llama_model_quantize_default_params()
    params.nthread = threads or (os.cpu_count() or 1)
    params.ftype = QUANT_FTYPES[q]
    params.allow_requantize = True
    _log_lines.clear()
    try:
        rc = ll.llama_model_quantize(str(src_p).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise SpecviewError(f"llama.cpp could not quantize {src_p.name} to {q} (status {rc}):\n{recent_log(6)}")
        os.replace(tmp, dst_p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst_p


# -- registry glue ---------------------------------------------------------------
from ..core.engine import WrappedModel  # noqa: E402
from ..core.session import InProcessBackend  # noqa: E402


class LlamaLoaded(WrappedModel):
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> LlamaEngine:
        return LlamaEngine(self.model, settings, n_ctx=n_ctx)


class LlamaBackend(InProcessBackend):
    """GGUF files through llama-cpp-python; ``demo:QUANT`` names the bundled demo model."""

    name = "llama.cpp"

    def __init__(self) -> None:
        _lib()  # fail now, clearly, if llama-cpp-python is missing

    def resolve(self, name: str, *, progress=None) -> str:
        from ..core import demo

        return str(demo.resolve(name, progress=progress))

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return (str(Path(name).expanduser().resolve()), settings.gpu_layers)

    def load(self, name: str, settings: EngineSettings) -> LlamaLoaded:
        return LlamaLoaded(LlamaModel(name, gpu_layers=settings.gpu_layers))

    def environment(self) -> dict[str, Any]:
        return llama_environment()
