"""An MLX engine with a planted batched difference in one layer, for the per-layer locate tests.

Registered by dotted path (``register_backend("planted-mlx", "plants_mlx:PlantedMLX")``),
so it runs in a real worker process exactly as the real engine does.
``SPECVIEW_PLANT_MLX=LAYER:DELTA`` (read in the worker when a model loads) wraps
that transformer block of the loaded model so that, when its input holds more
than one token, DELTA is added to its output: a difference only the batched
pass has, in that layer alone.  Unset, the engine is the plain MLX engine.
"""

from __future__ import annotations

import os

from specview.backends.mlx import MLXBackend
from specview.backends.mlx.backend import MLXLoaded

NAME = "planted-mlx"
PATH = "plants_mlx:PlantedMLX"


class PlantedBlock:
    """Calls the block; adds ``delta`` to its output when the pass is wider than one token."""

    def __init__(self, block, delta: float):
        self.block, self.delta = block, delta

    def __call__(self, x, *args, **kwargs):
        out = self.block(x, *args, **kwargs)
        return out + self.delta if x.shape[1] > 1 else out

    def __getattr__(self, key):
        return getattr(self.__dict__["block"], key)


class PlantedMLX(MLXBackend):
    name = NAME
    label = "planted MLX"

    def load(self, name, settings):
        loaded = super().load(name, settings)
        raw = os.environ.get("SPECVIEW_PLANT_MLX", "")
        if raw:
            layer, delta = raw.split(":")
            layers = loaded.model.model.model.layers
            layers[int(layer)] = PlantedBlock(layers[int(layer)], float(delta))
        return MLXLoaded(loaded.model)
