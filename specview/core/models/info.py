"""What discovery knows of one model, read from its header alone: the dataclasses of :mod:`specview.core.models`.

Everything here is plain data (frozen dataclasses that turn into JSON-ready
dicts), so the CLI, the app's pickers and a trace's ``config.models`` block
all speak of a model the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..errors import ModelFileError

#: where a model was found (``ModelInfo.source``, ``Root.source``)
SOURCES = ("lmstudio", "ollama", "hf", "llama.cpp", "folder", "demo")
#: what a model is: a GGUF file, or a model folder (config.json + safetensors, what mlx-lm loads)
KINDS = ("gguf", "folder")
#: the drafter architectures that serve one target (``ModelInfo.drafter_kind``) and the spec type each serves
DRAFTER_SPEC_TYPES = {"eagle3": "draft-eagle3", "dflash": "draft-dflash", "dspark": "draft-dspark"}

ProgressFn = Callable[[str], None]


class ModelHeaderError(ModelFileError):
    """A file or folder that looked like a model but whose header cannot be read (truncated, corrupt, not a
    model); the message names the path and says what is wrong with it."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path = str(path)
        self.why = why


class NotAModel(ModelHeaderError):
    """A file no engine runs as a model, whatever its bytes hold further on: a FIFO, socket or device, a
    multimodal projector, a vocabulary-only file, a GGUF of no tensors."""


@dataclass(frozen=True)
class VocabPrint:
    """A vocabulary's fingerprint: its size and a hash of its token strings and token types.

    Two models draft for each other (draft-simple) only with the same
    vocabulary, so equal prints mean "compatible" without loading either.
    ``texts`` hashes the token strings alone, the way a trace's
    ``models.target.vocab_fingerprint`` does, so a discovered model can be
    matched to the runs made with it.
    """

    n: int
    digest: str
    texts: str = ""
    #: hashes of each full block of 256 token strings: llama.cpp lets a draft's vocabulary differ from the
    #: target's in size by up to 128 (padding), so equal blocks up to the smaller one's end also fit
    blocks: tuple[str, ...] = ()
    #: the tokenizer's kind (``tokenizer.ggml.model``: llama, gpt2, ...; a folder's tokenizer.json model type)
    model: str = ""

    def __str__(self) -> str:
        return f"{self.n} tokens #{self.digest}"


@dataclass(frozen=True)
class ModelInfo:
    """One model found on disk, with what its header says (no weights are read).

    ``path`` is the GGUF file (the first shard of a split one) or the model
    folder; ``name`` is what a user types after ``-m`` / ``-md`` to get it
    (``ollama:qwen3:8b``, ``hf:org/repo:Q4_K_M``, ``lmstudio:pub/repo``,
    ``llama.cpp:org/repo:Q4_K_M``, ``demo:Q8_0``, or the path itself for a
    folder the user added); ``size`` is bytes on disk (all shards, or the
    folder's files); ``header_hash`` is a short hash of the header bytes (a
    GGUF's metadata and tensor table, a folder's config and weight headers): a
    run recorded with it can be checked against the file it re-runs on.
    """

    path: str
    kind: str
    name: str
    source: str
    family: str
    arch: str | None
    n_params: int | None
    size: int
    quant: str | None
    n_ctx: int | None
    vocab: VocabPrint | None
    mtp: bool
    drafter_kind: str | None
    drafter_for: str | None
    header_hash: str
    #: the width of the hidden state and the number of layers; for a drafter head, the width of the target's
    #: hidden states it reads (it must equal the target's ``n_embd``)
    n_embd: int | None = None
    n_layer: int | None = None
    #: a drafter head's target layers (EAGLE-3, DFlash, DSpark read the target's hidden states there)
    target_layers: tuple[int, ...] = ()
    #: the model's own name in its header (``general.name``), for display
    title: str | None = None
    #: other names that resolve to this model (``ollama:qwen3`` for ``ollama:qwen3:latest``)
    aliases: tuple[str, ...] = ()

    @property
    def is_drafter(self) -> bool:
        """A head that drafts for one target (EAGLE-3 / DFlash / DSpark), not a model that runs alone."""
        return self.drafter_kind is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layers"] = list(self.target_layers)
        d["aliases"] = list(self.aliases)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelInfo":
        v = d.get("vocab")
        if isinstance(v, dict):
            v = VocabPrint(**{**v, "blocks": tuple(v.get("blocks") or ())})
        return cls(**{**d, "vocab": v if isinstance(v, VocabPrint) else None,
                      "target_layers": tuple(d.get("target_layers") or ()), "aliases": tuple(d.get("aliases") or ())})


@dataclass(frozen=True)
class Problem:
    """Something a scan skipped, with the one line that says why (``specview models --problems``)."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


@dataclass(frozen=True)
class Root:
    """A place a scan looks: a store's folder (``source`` says which store) or a folder the user added."""

    source: str
    path: str


@dataclass
class Scan:
    """What a scan found: the models, and one :class:`Problem` per thing it skipped."""

    models: list[ModelInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    roots: list[Root] = field(default_factory=list)

    def by_name(self, name: str) -> ModelInfo | None:
        """The model whose name (or alias) is ``name`` exactly, else None."""
        return next((m for m in self.models if m.name == name or name in m.aliases), None)


@dataclass(frozen=True)
class DrafterFit:
    """A model that can draft for a target: the spec types it serves there, how much smaller it is, and why.

    ``ratio`` is the drafter's parameter count over the target's (None when
    either is unknown); ``model`` is None for the spec types that need no
    drafter model (the target's own MTP heads, n-gram lookups).
    """

    model: ModelInfo | None
    spec_types: tuple[str, ...]
    ratio: float | None
    why: str
