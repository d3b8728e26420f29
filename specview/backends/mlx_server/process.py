"""One ``mlx_lm.server`` process: which program, which flags, and when it is really ready.

The lifetime (process group, ``PR_SET_PDEATHSIG``, stop at exit and on
signals, requests that notice death and cancel) is
:class:`~specview.backends.local_server.process.LocalServer`'s.  What this
module adds is what ``mlx_lm.server`` does differently from llama-server:

* it cannot pick its own port and say which (``--port 0`` binds a port it
  never names), so specview hands it one that was free a moment before, and
  starts it again on another port when it lost that race;
* its ``/health`` answers 200 before the model is loaded (the model loads on
  its generation thread), and a failure there (a bad folder, an unknown
  architecture) or at ``bind`` leaves the process running but useless.  So a
  server is ready only once a one-token request has been answered, and its log
  is read while waiting: "generation thread died" or "Address already in use"
  stop it at once instead of after the start timeout;
* it reads no token-id prompts and no llama.cpp flags: the flags it gets are
  listed in :func:`server_args`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from ...core.errors import ConfigError
from ..local_server.process import HOST, START_TIMEOUT, CancelFn, LocalServer, ProgressFn, ServerError, program_path

__all__ = ["MLXServer", "find_server_program", "server_args", "split_server_args", "kv_flags", "ENV_BIN"]

#: environment variable naming the mlx_lm.server program (or a Python that has mlx-lm)
ENV_BIN = "SPECVIEW_MLX_SERVER"
#: log lines that mean the server will never answer, although its process is still running
_FATAL = (
    (re.compile(r"Address already in use|address already in use"), "its port {port} on {host} is already in use"),
    (re.compile(r"generation thread died"), "its generation thread died (it could not load the model?)"),
    (re.compile(r"error: (unrecognized arguments|argument|the following arguments)"), "it rejected its command line"),
)
#: flags specview sets itself; giving them in --server-args would contradict the run
_RESERVED = {
    "--host": "specview binds every server to 127.0.0.1",
    "--port": "specview picks free ports itself",
    "--model": "give the target with --target/-m",
    "--draft-model": "give the draft with --draft/-md",
    "--num-draft-tokens": "give it with --n-max (sent per request as num_draft_tokens)",
    "--prompt-cache-size": "specview keeps the prompt cache off, so every request evaluates its whole prompt",
    "--prefill-step-size": "give it with -b/--n-batch (the prompt prefill chunk, as in the in-process engines)",
    "--kv-bits": "give it with --kv-type (q8_0, q5_0, q4_0 ...)",
    "--kv-group-size": "specview sets it with --kv-type",
    "--quantized-kv-start": "specview sets it with --kv-type",
}
#: kv_type -> mlx-lm's --kv-bits (None: the model's own dtype, no quantized cache)
_KV_BITS = {"f16": None, "bf16": None, "f32": None, "q8_0": 8, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4}


def _program(value: str, source: str) -> list[str]:
    p = program_path(value, "mlx_lm.server program", source)
    if p.name.startswith("python"):  # a Python that has mlx-lm installed
        return [str(p), "-m", "mlx_lm", "server"]
    return [str(p)]


def find_server_program(explicit: str | None = None) -> list[str]:
    """The command that runs the user's ``mlx_lm.server``.

    ``explicit`` (``--server-bin``), else ``$SPECVIEW_MLX_SERVER``, else the
    ``mlx_lm.server`` installed next to this Python, else the one on PATH, else
    this Python's ``-m mlx_lm server``.  A path to a Python runs that Python's
    mlx-lm (``python -m mlx_lm server``).
    """
    for source, value in (("--server-bin", explicit), (f"${ENV_BIN}", os.environ.get(ENV_BIN))):
        if value:
            return _program(str(value), source)
    beside = Path(sys.executable).parent / "mlx_lm.server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("mlx_lm.server")
    if found:
        return [found]
    if getattr(sys, "frozen", False):  # the desktop app: its executable is not a Python that runs -m mlx_lm
        raise ServerError("no mlx_lm.server found on PATH: install mlx-lm where a Python of yours runs it (pip "
                          f"install mlx-lm), or give the program with --server-bin PATH (or ${ENV_BIN})")
    if importlib.util.find_spec("mlx_lm") is not None:
        return [sys.executable, "-m", "mlx_lm", "server"]
    raise ServerError("no mlx_lm.server found: install mlx-lm (pip install 'specview[mlx]'), or give the "
                      f"program with --server-bin PATH (or ${ENV_BIN})")


def split_server_args(server_args: str | Sequence[str] | None) -> list[str]:
    """The user's extra flags, split as a shell would; specview's own flags are refused with what to use instead."""
    if not server_args:
        return []
    try:
        toks = shlex.split(server_args) if isinstance(server_args, str) else [str(t) for t in server_args]
    except ValueError as exc:
        raise ConfigError(f"server_args: cannot split it into flags ({exc})", setting="server_args") from None
    for tok in toks:
        name = tok.split("=", 1)[0]
        if name in _RESERVED:
            raise ConfigError(f"server_args must not contain {name}: {_RESERVED[name]}", setting="server_args")
    return toks


def kv_flags(kv_type: str, group_size: int) -> list[str]:
    """mlx-lm's flags for specview's ``kv_type``: nothing for the model's own dtype, else a quantized cache
    from the first token on (as the in-process MLX engine keeps it)."""
    kv = kv_type.lower()
    if kv not in _KV_BITS:
        raise ConfigError(f"kv_type {kv_type!r} has no mlx-lm counterpart; use one of {', '.join(_KV_BITS)}",
                          setting="kv_type")
    bits = _KV_BITS[kv]
    if bits is None:
        return []
    return ["--kv-bits", str(bits), "--kv-group-size", str(group_size), "--quantized-kv-start", "0"]


def kv_bits(kv_type: str) -> int | None:
    return _KV_BITS.get(kv_type.lower())


def server_args(target: str, *, draft: str | None, n_batch: int, kv: Sequence[str],
                extra: Sequence[str]) -> list[str]:
    """One server's flags (without --host/--port): the target, the draft for the speculative server,
    no prompt cache (each request evaluates its whole prompt), the prefill chunk, the KV cache, the user's flags."""
    args = ["--model", target]
    if draft:
        args += ["--draft-model", draft]
    args += ["--prompt-cache-size", "0", "--prefill-step-size", str(int(n_batch)), *kv, *extra]
    return args


class MLXServer(LocalServer):
    """An ``mlx_lm.server`` on 127.0.0.1, ready once its model has answered a one-token request."""

    kind = "mlx_lm.server"
    listening_pattern = None  # it logs the port it was given, never one it picked
    ready_path = "/health"

    def __init__(self, program: Sequence[str], args: Sequence[str], *, label: str, port: int = 0,
                 progress: ProgressFn | None = None):
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"  # specview hands it local folders: it must never fetch anything
        super().__init__(list(program), args, label=label, port=port, progress=progress, env=env)
        self.fingerprint: str | None = None

    def fatal_cause(self, log: str) -> str | None:
        """Why a server that is still running will never answer, read from its log; None if nothing says so."""
        for pattern, words in _FATAL:
            if pattern.search(log):
                return words.format(port=self.port, host=HOST)
        return None

    def exit_cause(self, log: str) -> str:
        cause = self.fatal_cause(log)
        if cause:
            return f": {cause}"
        if "Traceback" in log:
            return ": it raised an exception"
        return ""

    def _probe(self) -> int | None:
        cause = self.fatal_cause(self.log_text())
        if cause:
            raise self._fatal("while starting", cause)
        return super()._probe()

    def _fatal(self, when: str, cause: str) -> ServerError:
        tail = self.log_tail(14)
        err = ServerError(
            f"{self.name} (pid {self.pid}) failed {when}: {cause}; specview stopped it.\n"
            f"  command: {shlex.join(self.command())}\n"
            + (f"  last lines of its output:\n{tail}" if tail else "  it printed nothing")
        )
        self.stop(grace=1.0)
        return err

    def wait_loaded(self, timeout: float = START_TIMEOUT, cancel: CancelFn | None = None) -> dict[str, Any]:
        """Wait for /health, then for a one-token answer (the model loads on the first request); return it."""
        self.wait_ready(timeout=timeout, cancel=cancel)
        body = {"prompt": "a", "max_tokens": 1, "temperature": 0.0, "seed": 0}
        try:
            resp = self.post("/v1/completions", body, timeout=timeout, cancel=cancel)
        except ServerError as exc:
            cause = self.fatal_cause(self.log_text())
            if cause and self.alive():
                raise self._fatal("while loading its model", cause) from None
            raise ServerError(f"{exc}\n  last lines of its output:\n{self.log_tail(14)}") from None
        self.fingerprint = resp.get("system_fingerprint") if isinstance(resp, dict) else None
        self.progress(f"{self.name} loaded its model")
        return resp
