"""One llama-server process: :class:`~specview.backends.local_server.process.LocalServer` plus what llama-server says."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from ...core.errors import SpecviewError
from ...core.llama_flags import engine_environment, server_argv
from ..llama_cpp.plant import check_server_repack
from ..local_server.process import HOST, LocalServer, ProgressFn, ServerError


class LlamaServer(LocalServer):
    """A llama-server on 127.0.0.1.  With ``port=0`` it picks a free port and says so in its log."""

    kind = "llama-server"
    listening_pattern = r"listening on https?://[^\s:]+:(\d+)"
    ready_path = "/health"

    def start(self) -> "LlamaServer":
        """Where the crash probe's result is planted as crashed, a llama-server that would repack quantized
        weights is refused before it starts, as a CPU whose repacked kernels crash would kill it
        (:mod:`specview.backends.llama_cpp.plant`)."""
        try:
            check_server_repack(self.args)
        except SpecviewError as exc:
            raise ServerError(str(exc)) from None
        super().start()
        return self

    def exit_cause(self, log: str) -> str:
        if "couldn't bind" in log or "Address already in use" in log:
            return f": port {self.port} on {HOST} is already in use"
        if "failed to load model" in log or "error loading model" in log:
            return ": it could not load the model"
        if re.search(r"(invalid argument|error: .*argument|unknown argument)", log, re.I):
            return ": it rejected its command line"
        return ""

    @classmethod
    def for_run(cls, binary: str, config: Mapping[str, Any], *, target: str, draft: str | None,
                speculative: bool, label: str, known_flags: Sequence[str] = (), ubatch: int | None = None,
                progress: ProgressFn | None = None) -> "LlamaServer":
        """The server a run's config describes: the report's command line plus host, port and no RAM prompt cache."""
        args = server_argv(config, target=target, draft=draft, speculative=speculative, ubatch=ubatch)
        if "--cache-ram" in known_flags:
            # no prompt state restored from RAM behind specview's back: a request evaluates what it says
            args += ["--cache-ram", "0"]
        knobs = engine_environment(config)  # ggml's start-up knobs (GGML_VK_*), as the report's prefix shows them
        return cls(binary, args, label=label, progress=progress, env={**os.environ, **knobs} if knobs else None)
