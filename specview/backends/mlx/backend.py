"""The MLX backend: what the registry names as ``specview.backends.mlx:MLXBackend``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ...core.config import EngineSettings
from ...core.engine import WrappedModel
from ...core.errors import ModelFileError
from ...core.inprocess import InProcessBackend
from ...core.models import is_store_name, resolve_name
from ...core.resolve import DecidedSettings, require_decided
from . import lib
from .demo import demo_folder
from .engine import MLXEngine, MLXModel

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class MLXLoaded(WrappedModel):
    def new_engine(self, settings: DecidedSettings, n_ctx: int) -> MLXEngine:
        return MLXEngine(self.model, require_decided(settings, "an MLX engine"), n_ctx=n_ctx)

    def observed_engine(self, settings: DecidedSettings, n_ctx: int, selection: str = "all") -> MLXEngine:
        """An engine whose passes can be observed layer by layer (``specview locate``; MLX has no per-op graph)."""
        from .layers import observed_engine

        return observed_engine(self.model, require_decided(settings, "an observed MLX engine"), n_ctx, selection)


class MLXBackend(InProcessBackend):
    """MLX model folders (or Hugging Face ids, online) through mlx-lm."""

    name = "mlx"
    label = "MLX (mlx-lm)"
    model_kind = "folder"

    def __init__(self) -> None:
        lib._mx()  # fail now, clearly, if mlx or mlx-lm is missing

    def resolve(self, name: str, *, progress: Callable[[str], None] | None = None) -> str:
        if is_store_name(name):  # a model folder in a store (the Hugging Face cache, LM Studio's): found offline
            return resolve_name(name, "folder").path
        p = Path(name).expanduser()
        if p.exists():
            p = p.resolve()
            if p.is_file() and (p.name == "config.json" or p.suffix == ".safetensors"):
                p = p.parent
            return str(p)
        if name.startswith("demo:"):
            return str(demo_folder(name.split(":", 1)[1], progress=progress))
        if name.startswith(("/", ".", "~")) or "\\" in name or not _HF_ID.match(name):
            raise ModelFileError(
                f"{name}: no such MLX model folder. Give the folder written by mlx_lm.convert, "
                "or a Hugging Face id such as mlx-community/SmolLM2-135M-Instruct-8bit."
            )
        if progress:
            progress(f"fetching {name} from Hugging Face")
        try:
            from mlx_lm.utils import _download

            return str(Path(_download(name)).resolve())
        except Exception as exc:
            raise ModelFileError(
                f"{name}: not a local folder, and fetching it from Hugging Face failed "
                f"({type(exc).__name__}: {exc}). Check the id and your connection, or give a local MLX folder."
            ) from exc

    def model_variants(self, path: str) -> tuple[list[Any], list[Any]]:
        """The precisions of the MLX model folder ``path`` the user has, and those mlx-lm's conversion can derive."""
        from .variants import derivable_variants, list_variants

        return list_variants(path), derivable_variants(path)

    def derive_variant(self, source: str, quant: str, *, dest: str | None = None,
                       progress: Callable[[str], None] | None = None) -> str:
        """``quant`` ("8bit", "4bit") from the unquantized folder ``source`` (into specview's cache; ``dest`` unused)."""
        from .variants import derive_quantized

        return str(derive_quantized(source, int(quant.lower().removesuffix("bit")), progress=progress))

    def model_key(self, name: str, settings: EngineSettings) -> tuple:
        return (str(Path(name).expanduser().resolve()),)

    def load(self, name: str, settings: DecidedSettings) -> MLXLoaded:
        require_decided(settings, "MLXBackend.load")
        return MLXLoaded(MLXModel(name))

    def environment(self) -> dict[str, Any]:
        return lib.mlx_environment()
