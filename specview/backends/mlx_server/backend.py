"""The ``mlx-server`` backend: what the registry loads as ``specview.backends.mlx_server:MLXServerBackend``."""

from __future__ import annotations

from typing import Any

from ...core.config import EngineSettings, RunConfig
from ...core.errors import ConfigError
from ...core.registry import Backend, ProgressFn

#: the spec types mlx_lm.server runs: none (both arms without a draft model) and a separate draft model
SPEC_TYPES = ("none", "draft-simple")


class MLXServerBackend(Backend):
    """The user's own ``mlx_lm.server``, started by specview on 127.0.0.1 (MLX model folders)."""

    name = "mlx-server"
    label = "mlx_lm.server"
    model_kind = "folder"
    in_process = False

    def __init__(self) -> None:
        from ..mlx import lib

        lib._mx()  # the prompt's tokens and the diagnosis need mlx-lm in this process too
        self._mlx: Any = None

    @property
    def mlx(self) -> Any:
        """The in-process MLX backend: folders, Hugging Face ids and demo names resolve as there."""
        if self._mlx is None:
            from ..mlx.backend import MLXBackend

            self._mlx = MLXBackend()
        return self._mlx

    def spec_types(self, settings: EngineSettings | None = None) -> list[str]:
        return list(SPEC_TYPES)

    def check(self, cfg: RunConfig) -> None:
        """Refuse what mlx_lm.server cannot do, naming the setting and what to do instead."""
        super().check(cfg)
        if cfg.p_min not in (0.0, 1.0):
            raise ConfigError(f"p_min must be 0 or 1 with the mlx-server engine (got {cfg.p_min:g}): mlx-lm drafts "
                              "a fixed number of tokens; p_min 1 (the zero-draft control) is sent as "
                              "num_draft_tokens 0", setting="p_min")
        if cfg.n_min:
            raise ConfigError(f"n_min must be 0 with the mlx-server engine (got {cfg.n_min}): mlx-lm never drops "
                              "a short draft", setting="n_min")
        if cfg.serial_verify:
            raise ConfigError("serial_verify runs on the in-process engines only; for mlx_lm.server the diagnosis "
                              "runs it (mlx-lm's loop in process, every verify row a single-token pass)",
                              setting="serial_verify")
        from .process import kv_flags, split_server_args

        kv_flags(cfg.engine.kv_type, 64)
        split_server_args(cfg.engine.server_args)

    def num_draft_tokens(self, cfg: RunConfig) -> int:
        """``num_draft_tokens`` per request: n_max, or 0 for the zero-draft control (p_min 1)."""
        return 0 if cfg.p_min >= 1.0 else int(cfg.n_max)

    def command_builders(self) -> Any:
        """What builds this engine's mlx_lm.server command lines and requests (``kv_bits``, ``kv_flags``,
        ``split_server_args``, ``server_args``, ``arm_request``): a report writes the reproduction of a run with
        the very flags and request body the run used, asked through the registry as core asks for a runner."""
        from types import SimpleNamespace

        from . import process, protocol

        return SimpleNamespace(kv_bits=process.kv_bits, kv_flags=process.kv_flags,
                               split_server_args=process.split_server_args, server_args=process.server_args,
                               arm_request=protocol.arm_request)

    def kv_group_size(self, model_config: dict[str, Any]) -> int:
        from ..mlx.folders import kv_group_size

        return kv_group_size(model_config)

    def resolve(self, name: str, *, progress: ProgressFn | None = None) -> str:
        return self.mlx.resolve(name, progress=progress)

    def environment(self) -> dict[str, Any]:
        from ..mlx.lib import mlx_environment

        return {f"in_process_{k}": v for k, v in mlx_environment().items()}

    def setup_facts(self, settings: EngineSettings, *, deep: bool = True) -> list[Any]:
        """The program specview would start, and the mlx-lm it diagnoses with (no server is started)."""
        from ...core.facts import Fact
        from ..local_server.process import ServerError
        from ..mlx.lib import mlx_environment
        from .process import find_server_program

        env = mlx_environment()
        inproc = Fact(self.name, "in_process", {k: env.get(k) for k in ("mlx", "mlx_lm")},
                      f"in process (prompt tokens, diagnosis): mlx {env.get('mlx')}, mlx-lm {env.get('mlx_lm')}",
                      "info")
        try:
            program = find_server_program(settings.server_bin or None)
        except ServerError as exc:
            return [Fact(self.name, "program", None, f"mlx_lm.server: not found ({exc})", "info",
                         advice="pip install 'specview[mlx]', or give --server-bin PATH"), inproc]
        import shlex

        return [Fact(self.name, "program", program, f"mlx_lm.server: {shlex.join(program)}", "ok"), inproc]

    def runner(self, *, progress: ProgressFn | None = None) -> Any:
        from .runner import MLXServerRunner

        return MLXServerRunner(self, progress=progress)
