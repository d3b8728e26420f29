"""The llama.cpp backend as the registry sees it: GGUF files, ``demo:QUANT`` names, a Session runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.config import EngineSettings
from ...core.engine import WrappedModel
from ...core.session import InProcessBackend
from . import demo
from .engine import LlamaEngine
from .lib import _lib, llama_environment
from .model import LlamaModel


class LlamaLoaded(WrappedModel):
    """A loaded GGUF file; every arm, drafter and replay opens its own context on it."""

    def new_engine(self, settings: EngineSettings, n_ctx: int) -> LlamaEngine:
        return LlamaEngine(self.model, settings, n_ctx=n_ctx)


class LlamaBackend(InProcessBackend):
    """GGUF files through llama-cpp-python; ``demo:QUANT`` names the bundled demo model."""

    name = "llama.cpp"
    label = "llama.cpp"
    model_kind = "gguf"

    def __init__(self) -> None:
        _lib()  # fail now, clearly, if llama-cpp-python is missing

    def resolve(self, name: str, *, progress=None) -> str:
        return str(demo.resolve(name, progress=progress))

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return (str(Path(name).expanduser().resolve()), settings.gpu_layers)

    def load(self, name: str, settings: EngineSettings) -> LlamaLoaded:
        return LlamaLoaded(LlamaModel(name, gpu_layers=settings.gpu_layers))

    def environment(self) -> dict[str, Any]:
        return llama_environment()
