"""Backends by name.  Real engines and test fakes register through the same door.

A backend turns a model name (a path, or ``demo:Q8_0``) into a loaded model,
and a loaded model opens engines (contexts) on its shared weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from .engine import BackendUnavailable, Engine, EngineSettings, VocabInfo


class LoadedModel(ABC):
    """Weights loaded once; every arm, drafter and replay opens its own engine on them."""

    path: str

    @abstractmethod
    def facts(self) -> dict[str, Any]: ...

    @property
    @abstractmethod
    def vocab(self) -> VocabInfo: ...

    @abstractmethod
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]: ...

    @abstractmethod
    def new_engine(self, settings: EngineSettings, n_ctx: int) -> Engine: ...

    @property
    def n_ctx_train(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class WrappedModel(LoadedModel):
    """A :class:`LoadedModel` over a backend's own model object.

    The object provides ``path``, ``facts()``, ``vocab``, ``n_ctx_train``,
    ``tokenize(text, chat=)`` and ``close()``; a backend subclasses this and
    adds only :meth:`new_engine`.
    """

    def __init__(self, model: Any):
        self.model = model
        self.path = str(model.path)

    def facts(self) -> dict[str, Any]:
        return self.model.facts()

    @property
    def vocab(self) -> VocabInfo:
        return self.model.vocab

    @property
    def n_ctx_train(self) -> int | None:
        return self.model.n_ctx_train

    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        return self.model.tokenize(text, chat=chat)

    def close(self) -> None:
        self.model.close()


class Backend(ABC):
    name: str = "abstract"

    def resolve(self, name: str, *, progress: Callable[[str], None] | None = None) -> str:
        """Turn a user-given model name into something :meth:`load` accepts."""
        return name

    @abstractmethod
    def load(self, name: str, settings: EngineSettings) -> LoadedModel: ...

    def environment(self) -> dict[str, Any]:
        return {}

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        """Two names with the same key share one loaded model."""
        return (name, settings.gpu_layers)


_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def backend_names() -> list[str]:
    _register_builtins()
    return sorted(_FACTORIES)


def get_backend(name: str) -> Backend:
    _register_builtins()
    if name not in _FACTORIES:
        raise BackendUnavailable(f"unknown engine {name!r}; available: {', '.join(sorted(_FACTORIES))}")
    b = _INSTANCES.get(name)
    if b is None:
        b = _FACTORIES[name]()
        _INSTANCES[name] = b
    return b


_builtins_done = False


def _register_builtins() -> None:
    global _builtins_done
    if _builtins_done:
        return
    _builtins_done = True

    def llama() -> Backend:
        from ..backends.llama_cpp import LlamaBackend

        return LlamaBackend()

    _FACTORIES.setdefault("llama.cpp", llama)

    def mlx() -> Backend:
        from ..backends.mlx import MLXBackend  # type: ignore[import-not-found]

        return MLXBackend()

    _FACTORIES.setdefault("mlx", mlx)
