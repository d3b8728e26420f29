"""The ``llama-server`` backend: what the engine checks in a config, decides for the machine and says about the
binary; its runner (:mod:`.runner`) starts the servers and runs the arms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.config import EngineSettings, RunConfig
from ...core.errors import ConfigError, SpecviewError
from ...core.llama_flags import UB1_REFUSED, split_server_args, uses_draft_file
from ...core.registry import Backend, ProgressFn, get_backend
from ...core.resolve import Decision
from ..local_server.process import ServerError
from .binary import find_server_bin, server_info
from .runner import ServerRunner


class ServerBackend(Backend):
    """The user's own ``llama-server`` binary, started by specview on 127.0.0.1."""

    name = "llama-server"
    label = "llama-server (your binary)"
    model_kind = "gguf"
    in_process = False

    def spec_types(self, settings: EngineSettings | None = None) -> list[str]:
        """The spec types the binary's own ``--help`` lists."""
        binary = find_server_bin((settings.server_bin if settings else "") or None)
        return list(server_info(binary)["spec_types"])

    def check(self, cfg: RunConfig) -> None:
        binary = find_server_bin(cfg.engine.server_bin or None)
        types = server_info(binary)["spec_types"]
        if not types:
            raise ServerError(f"{binary} lists no --spec-type in its --help: it is too old for specview's "
                              "llama-server engine (it needs a llama.cpp with --spec-type)")
        if cfg.spec_type not in types:
            raise ConfigError(f"spec_type {cfg.spec_type} is not offered by this llama-server; it offers "
                              f"{', '.join(types)}", setting="spec_type")
        if uses_draft_file(cfg.spec_type) and not cfg.draft:
            raise ConfigError(f"spec_type {cfg.spec_type} needs a draft model file", setting="draft")
        if cfg.serial_verify and cfg.spec_type in UB1_REFUSED:
            raise ConfigError(f"--serial-verify: {UB1_REFUSED[cfg.spec_type]}; run without it (a fork's diagnosis "
                              "then rests on the gap and the replayed shapes)", setting="serial_verify")
        if cfg.spec_type == "draft-dspark" and cfg.p_min > 0:
            from ..llama_cpp.tiny_drafters.dflash import dspark_p_min_refusal

            draft = self.resolve(cfg.draft)
            why = dspark_p_min_refusal(draft, spec_type=cfg.spec_type)
            if why:  # llama-server would log it and serve with no speculation at all: a run that proves nothing
                raise ConfigError(f"p_min {cfg.p_min:g} with {Path(draft).name}: llama.cpp refuses it ({why}); "
                                  "a DSpark drafter without a confidence head cannot stop a draft early",
                                  setting="p_min")
        if cfg.engine.rollback not in (None, "auto"):
            raise ConfigError(f"rollback {cfg.engine.rollback}: llama-server picks its own (checkpoint and replay for "
                              "draft-simple and the n-gram types, n_rs_seq snapshots for draft-mtp, draft-eagle3, "
                              "draft-dflash and draft-dspark) and has no flag to change it; --rollback applies to "
                              "--engine llama.cpp", setting="rollback")
        split_server_args(cfg.engine.server_args)

    def decide(self, cfg: RunConfig, *, measure: bool = True, default_target: bool = False,
               progress: ProgressFn | None = None) -> list[Decision]:
        """As for the llama.cpp engine: the same ggml CPU code repacks the weights (the AMX probe decides).
        llama-server picks its own rollback, and a server run keeps the target it is given."""
        from ..llama_cpp.probe import repack_decision

        d = repack_decision(cfg.engine, measure=measure)
        return [d] if d is not None else []

    def has_mtp_heads(self, target: str) -> bool:
        from ..llama_cpp.model import has_mtp_heads

        return has_mtp_heads(target)

    def resolve(self, name: str, *, progress: ProgressFn | None = None) -> str:
        """GGUF names resolve as for the llama.cpp engine (a path, or a ``demo:QUANT`` name)."""
        return get_backend("llama.cpp").resolve(name, progress=progress)

    def environment(self) -> dict[str, Any]:
        return {}

    def setup_facts(self, settings: EngineSettings, *, deep: bool = True) -> list[Any]:
        from ...core.doctor import Fact

        try:
            binary = find_server_bin(settings.server_bin or None)
            info = server_info(binary)
        except SpecviewError as exc:
            return [Fact(self.name, "binary", None, f"llama-server: not found ({exc})", "info",
                         advice="build one with scripts/build-llama-server.sh, or give --server-bin PATH")]
        first = info["version"].splitlines()[0] if info["version"] else "?"
        return [
            Fact(self.name, "binary", binary, f"llama-server: {binary} ({first})", "ok"),
            Fact(self.name, "devices", info["devices"],
                 "devices: " + (", ".join(info["devices"]) or "CPU only"), "info"),
            Fact(self.name, "spec_types", info["spec_types"], "spec types: " + ", ".join(info["spec_types"]), "info"),
        ]

    def runner(self, *, progress: ProgressFn | None = None) -> "ServerRunner":
        return ServerRunner(progress=progress)
