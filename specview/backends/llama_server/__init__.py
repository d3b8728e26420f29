"""The llama-server engine: the user's own ``llama-server`` binary, driven from the outside.

* :mod:`.binary` -- finding the binary; its version, devices, spec types and flags.
* :mod:`.process` -- one llama-server process (a :class:`~specview.backends.local_server.LocalServer`).
* :mod:`.pool` -- the servers a runner keeps across runs, one target at a time.
* :mod:`.protocol` -- the native ``/completion`` requests and the arms, rounds
  and token-by-token plain decoding rebuilt from their answers.
* :mod:`.backend` -- :class:`ServerBackend` (registered as ``llama-server``): the checks of a
  config, the machine's decisions, the binary's facts.
* :mod:`.runner` -- :class:`ServerRunner`: the servers a run needs, both arms, the trace.
* :mod:`.diagnose` -- a fork explained from outside the server, with core's rules.

The process lifetime and the OpenAI-compatible endpoints are shared with other
local servers in :mod:`specview.backends.local_server`.  ``docs/llama-server.md``
describes the protocol, each replay's shape and every null field.
"""

from __future__ import annotations

from ..local_server.process import Cancelled, ServerError
from .backend import ServerBackend
from .binary import (BUILD_VERSION, ENV_BIN, cached_server_path, find_server_bin, parse_spec_types, server_devices,
                     server_info, server_spec_types, server_version)
from .process import LlamaServer
from .runner import ServerRunner, run_server_trace

__all__ = [
    "ServerBackend",
    "ServerRunner",
    "run_server_trace",
    "LlamaServer",
    "ServerError",
    "Cancelled",
    "BUILD_VERSION",
    "ENV_BIN",
    "cached_server_path",
    "find_server_bin",
    "parse_spec_types",
    "server_devices",
    "server_info",
    "server_spec_types",
    "server_version",
]
