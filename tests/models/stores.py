"""Fake model stores in a temporary home: LM Studio, ollama (manifest + blob), the Hugging Face hub cache,
llama.cpp's download cache and a folder of the user's, laid out as those tools lay them out, holding the
suite's tiny GGUF models (which llama.cpp loads and runs) and tiny model folders (headers only).

:func:`build_stores` returns a :class:`Stores` whose ``expected`` maps every name form to the file it must
resolve to, so a test (of the CLI, of the app's pickers) checks resolution against the layout it built,
never against what the scanner itself reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from tinymodel import vocab_tokens, write_tiny_llama

#: ``general.file_type`` values (llama.cpp's ``llama_ftype``)
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15}
REV = "0123456789abcdef0123456789abcdef01234567"


def set_file_type(path: Path, quant: str) -> Path:
    """Rewrite the ``general.file_type`` value of a GGUF written by :func:`write_tiny_llama` in place (the
    weights stay F32: llama.cpp reads each tensor's own type, the file type only names the file)."""
    data = bytearray(path.read_bytes())
    key = b"general.file_type"
    i = data.find(struct.pack("<Q", len(key)) + key)
    assert i >= 0, f"{path} has no general.file_type"
    at = i + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # a uint32
    struct.pack_into("<I", data, at + 4, FTYPES[quant])
    path.write_bytes(bytes(data))
    return path


def tiny_gguf(path: Path, *, quant: str = "F32", seed: int = 0, noise: float = 0.0, extra: str = "",
              n_embd: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(path, seed=seed, noise=noise, extra=extra, n_embd=n_embd)
    return set_file_type(path, quant)


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose tensors are zeros of the given (dtype, shape)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))


def tiny_folder(folder: Path, *, bits: int | None = None, extra: str = "", n_embd: int = 64) -> Path:
    """A model folder (config.json, model.safetensors, tokenizer.json) of a 2-layer llama, 4-bit when ``bits``."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens, _scores, _types = vocab_tokens(extra)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": n_embd,
           "num_hidden_layers": 2, "max_position_embeddings": 2048, "vocab_size": len(tokens),
           "torch_dtype": "float32"}
    if bits:
        cfg["quantization"] = {"bits": bits, "group_size": 32}
    (folder / "config.json").write_text(json.dumps(cfg))
    per = 32 // bits if bits else 1
    t: dict[str, tuple[str, list[int]]] = {}
    for i in range(2):
        if bits:
            t[f"model.layers.{i}.mlp.up_proj.weight"] = ("U32", [128, n_embd // per])
            t[f"model.layers.{i}.mlp.up_proj.scales"] = ("F16", [128, n_embd // 32])
        else:
            t[f"model.layers.{i}.mlp.up_proj.weight"] = ("F32", [128, n_embd])
    t["model.embed_tokens.weight"] = ("F32", [len(tokens), n_embd])
    _safetensors(folder / "model.safetensors", t)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}))
    return folder


def folder_params(n_embd: int = 64, n_vocab: int | None = None) -> int:
    """The parameter count of :func:`tiny_folder`'s model, computed from its shapes (not from the scanner)."""
    n_vocab = n_vocab if n_vocab is not None else len(vocab_tokens()[0])
    return 2 * 128 * n_embd + n_vocab * n_embd


def _hf_file(hub: Path, repo: str, rel: str, make) -> Path:
    """``rel`` in the snapshot of ``repo`` as the hub lays it out: a symlink to ``blobs/<hash>``."""
    rdir = hub / ("models--" + repo.replace("/", "--"))
    (rdir / "refs").mkdir(parents=True, exist_ok=True)
    (rdir / "refs" / "main").write_text(REV)
    tmp = rdir / "blobs" / ".incoming"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    make(tmp)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    blob = rdir / "blobs" / digest
    os.replace(tmp, blob)
    link = rdir / "snapshots" / REV / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return link


def _ollama(root: Path, model: str, tag: str, make_or_blob) -> Path:
    """A model in ollama's store: its blob (written by ``make_or_blob``, or an existing blob) and a manifest."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    if isinstance(make_or_blob, Path):
        blob = make_or_blob
    else:
        tmp = blobs / "incoming"
        make_or_blob(tmp)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        blob = blobs / f"sha256-{digest}"
        os.replace(tmp, blob)
    digest = blob.name.replace("-", ":", 1)
    man = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    man.parent.mkdir(parents=True, exist_ok=True)
    man.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": blob.stat().st_size}]}))
    return blob


@dataclass
class Stores:
    home: Path
    #: every name form -> the path it must resolve to
    expected: dict[str, Path] = field(default_factory=dict)
    #: names that must be refused as ambiguous, with the names they must list
    ambiguous: dict[str, set[str]] = field(default_factory=dict)
    user_folder: Path | None = None

    def env(self, **more: str) -> dict[str, str]:
        """An environment pointing specview at this home only (its caches, its settings)."""
        return {"HOME": str(self.home), "SPECVIEW_CACHE": str(self.home / ".cache" / "specview"),
                "SPECVIEW_CONFIG_DIR": str(self.home / ".config" / "specview"), **more}


def build_stores(home: Path) -> Stores:
    """Every store's layout under ``home``, with the tiny models in it (see the module docstring).

    The ollama target (``ollama:tiny:8b``, also ``:latest``) and the hub's draft share the tiny vocabulary;
    the user folder's ``foreign.gguf`` does not.
    """
    s = Stores(home)
    # LM Studio: two quantizations in one repository, and a model folder
    lm = home / ".lmstudio" / "models" / "tinypub"
    s.expected["lmstudio:tinypub/Tiny-GGUF:Q8_0"] = tiny_gguf(lm / "Tiny-GGUF" / "tiny-Q8_0.gguf", quant="Q8_0")
    s.expected["lmstudio:tinypub/Tiny-GGUF:F32"] = tiny_gguf(lm / "Tiny-GGUF" / "tiny-F32.gguf", quant="F32")
    s.expected["lmstudio:tinypub/Tiny-GGUF:tiny-F32.gguf"] = s.expected["lmstudio:tinypub/Tiny-GGUF:F32"]
    s.ambiguous["lmstudio:tinypub/Tiny-GGUF"] = {"lmstudio:tinypub/Tiny-GGUF:Q8_0", "lmstudio:tinypub/Tiny-GGUF:F32"}
    s.expected["lmstudio:tinypub/Tiny-MLX"] = tiny_folder(lm / "Tiny-MLX", bits=4)
    # ollama: one blob under two tags, and a second model
    ol = home / ".ollama" / "models"
    blob = _ollama(ol, "tiny", "8b", lambda p: tiny_gguf(p, quant="Q8_0"))
    _ollama(ol, "tiny", "latest", blob)
    s.expected["ollama:tiny:8b"] = s.expected["ollama:tiny:latest"] = s.expected["ollama:tiny"] = blob
    s.expected["ollama:tinydraft:q4"] = _ollama(ol, "tinydraft", "q4",
                                                lambda p: tiny_gguf(p, quant="Q4_0", noise=0.02))
    # the Hugging Face hub: a one-file repository, a two-file one, a model folder
    hub = home / ".cache" / "huggingface" / "hub"
    d = _hf_file(hub, "tinyorg/Tiny-Draft-GGUF", "tiny-draft.Q4_0.gguf",
                 lambda p: tiny_gguf(p, quant="Q4_0", noise=0.02))
    s.expected["hf:tinyorg/Tiny-Draft-GGUF"] = s.expected["hf:tinyorg/Tiny-Draft-GGUF:Q4_0"] = d
    s.expected["hf:tinyorg/Tiny-Draft-GGUF:tiny-draft.Q4_0.gguf"] = d
    for q in ("Q4_K_M", "Q8_0"):
        s.expected[f"hf:tinyorg/Tiny-Multi-GGUF:{q}"] = _hf_file(
            hub, "tinyorg/Tiny-Multi-GGUF", f"tiny-multi.{q}.gguf", lambda p, q=q: tiny_gguf(p, quant=q, seed=3))
    s.expected["hf:tinyorg/Tiny-Multi-GGUF:q4_k_m"] = s.expected["hf:tinyorg/Tiny-Multi-GGUF:Q4_K_M"]
    s.ambiguous["hf:tinyorg/Tiny-Multi-GGUF"] = {"hf:tinyorg/Tiny-Multi-GGUF:Q4_K_M",
                                                 "hf:tinyorg/Tiny-Multi-GGUF:Q8_0"}
    snap = hub / "models--mlx-community--Tiny-4bit" / "snapshots" / REV
    tiny_folder(snap, bits=4)
    (snap.parent.parent / "refs").mkdir(parents=True, exist_ok=True)
    (snap.parent.parent / "refs" / "main").write_text(REV)
    s.expected["hf:mlx-community/Tiny-4bit"] = snap
    # llama.cpp's cache: a -hf download with its manifest, and a file on its own
    lc = home / ".cache" / "llama.cpp"
    got = tiny_gguf(lc / "tinyorg_Tiny-GGUF_tiny-Q4_K_M.gguf", quant="Q4_K_M", seed=5)
    (lc / "manifest=tinyorg=Tiny-GGUF=Q4_K_M.json").write_text(json.dumps(
        {"ggufFile": {"rfilename": "tiny-Q4_K_M.gguf", "size": got.stat().st_size}}))
    s.expected["llama.cpp:tinyorg/Tiny-GGUF:Q4_K_M"] = got
    s.expected["llama.cpp:loose.gguf"] = tiny_gguf(lc / "loose.gguf", seed=6)
    # a folder of the user's (remembered by the test that needs it): another vocabulary
    s.user_folder = home / "mymodels"
    s.expected[str(s.user_folder / "foreign.gguf")] = tiny_gguf(s.user_folder / "foreign.gguf", extra="x")
    return s


def header_gguf(path: Path, arch: str, *, extra: str = "", pad: int = 0, meta: dict | None = None,
                tensors: dict[str, tuple[int, ...]] | None = None, name: str | None = None) -> Path:
    """A GGUF whose header is a model's (the tiny vocabulary, ``pad`` padding tokens appended, ``meta`` as
    ``{key: value}``) with small zero tensors: for the facts discovery reads, not for loading."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = vocab_tokens(extra)
    tokens = tokens + [f"[PAD{i}]" for i in range(pad)]
    scores, types = scores + [0.0] * pad, types + [5] * pad  # UNUSED
    w = gguf.GGUFWriter(str(path), arch)
    if name:
        w.add_name(name)
    w.add_file_type(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for k, v in (meta or {}).items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_string(k, str(v))
    for tname, shape in (tensors or {"output_norm.weight": (64,)}).items():
        w.add_tensor(tname, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
