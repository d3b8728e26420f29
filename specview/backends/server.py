"""The llama-server engine's former module: its names now live in :mod:`specview.backends.llama_server`.

Kept so ``from specview.backends.server import run_server_trace`` (and the other
names below) keeps working; new code asks the registry for the ``llama-server``
backend and drives its runner.
"""

from __future__ import annotations

from ..core.llama_flags import split_server_args
from .llama_server import (BUILD_VERSION, ENV_BIN, Cancelled, LlamaServer, ServerBackend, ServerError, ServerRunner,
                           cached_server_path, find_server_bin, parse_spec_types, run_server_trace, server_devices,
                           server_info, server_spec_types, server_version)
from .llama_server.protocol import arm_from_response, completion_body

__all__ = [
    "BUILD_VERSION", "ENV_BIN", "Cancelled", "LlamaServer", "ServerBackend", "ServerError", "ServerRunner",
    "arm_from_response", "cached_server_path", "completion_body", "find_server_bin", "parse_spec_types",
    "run_server_trace", "server_devices", "server_info", "server_spec_types", "server_version", "split_server_args",
]
