"""Finding the user's llama-server and asking it what it is: version, devices, spec types, flags."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Sequence

from ...core.paths import cache_dir
from ..local_server.process import ServerError, program_path, rc_text, tail_text

#: llama-cpp-python version whose vendored llama.cpp ``scripts/build-llama-server.sh`` builds
BUILD_VERSION = "0.3.36"
#: environment variable naming the llama-server binary
ENV_BIN = "SPECVIEW_LLAMA_SERVER"


def cached_server_path(version: str = BUILD_VERSION) -> Path:
    """Where ``scripts/build-llama-server.sh`` puts the binary it builds."""
    return cache_dir() / "llama-server" / version / "llama-server"


def find_server_bin(explicit: str | os.PathLike[str] | None = None) -> str:
    """The llama-server to run: ``explicit``, else ``$SPECVIEW_LLAMA_SERVER``, else PATH, else the cached build."""
    for source, value in (("--server-bin", explicit), (f"${ENV_BIN}", os.environ.get(ENV_BIN))):
        if value:
            return check_bin(str(value), source)
    found = shutil.which("llama-server")
    if found:
        return check_bin(found, "PATH")
    cached = cached_server_path()
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    raise ServerError(
        "no llama-server binary found: give one with --server-bin PATH (or set "
        f"${ENV_BIN}), put llama-server on PATH, or build one with scripts/build-llama-server.sh "
        f"(it lands in {cached})"
    )


def check_bin(path: str, source: str) -> str:
    """``path`` resolved, or a :class:`ServerError` saying why it cannot be run (``source`` names where it came from)."""
    return str(program_path(path, "llama-server binary", source).resolve())


def _run_bin(binary: str, args: Sequence[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        cp = subprocess.run([binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ServerError(f"{binary} {' '.join(args)} did not finish within {timeout:.0f} s") from None
    except OSError as exc:
        raise ServerError(f"cannot run {binary}: {exc.strerror or exc}") from None
    return cp.returncode, cp.stdout.decode("utf-8", "replace")


_INFO: dict[tuple, dict[str, Any]] = {}
_INFO_LOCK = threading.Lock()


def server_info(binary: str) -> dict[str, Any]:
    """The binary's ``--version``, ``--list-devices``, and the spec types and flags its ``--help`` lists (cached)."""
    binary = check_bin(binary, "argument")
    st = os.stat(binary)
    key = (binary, st.st_mtime_ns, st.st_size)
    with _INFO_LOCK:
        if key in _INFO:
            return dict(_INFO[key])
    rc, out = _run_bin(binary, ["--version"])
    if rc != 0 or "version" not in out.lower():
        raise ServerError(f"{binary} does not look like llama-server: `--version` exited with {rc_text(rc)}"
                          + (f" and printed:\n{tail_text(out, 8)}" if out.strip() else " and printed nothing"))
    version = "\n".join(ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("load_backend", "ggml_")))
    rc_d, devices_out = _run_bin(binary, ["--list-devices"])
    devices = parse_devices(devices_out) if rc_d == 0 else []
    _, help_out = _run_bin(binary, ["--help"])
    info = {
        "binary": binary,
        "version": version.strip(),
        "devices": devices,
        "devices_raw": devices_out.strip() if rc_d == 0 else None,
        "spec_types": parse_spec_types(help_out),
        "help_flags": sorted(set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", help_out))),
    }
    with _INFO_LOCK:
        _INFO[key] = info
    return dict(info)


def parse_spec_types(help_text: str) -> list[str]:
    """The spec types on the ``--spec-type`` line of llama-server's ``--help`` (empty if it has none)."""
    m = re.search(r"--spec-type\s+([a-z0-9][a-z0-9,\-]*)", help_text)
    if not m:
        return []
    return [t for t in m.group(1).split(",") if t]


def parse_devices(text: str) -> list[str]:
    out = []
    seen = False
    for ln in text.splitlines():
        if ln.strip().lower().startswith("available devices"):
            seen = True
            continue
        if seen and ln.strip() and ln.strip() != "(none)":
            out.append(ln.strip())
    return out


def server_spec_types(binary: str | None = None) -> list[str]:
    """The ``--spec-type`` values this llama-server offers, as its own ``--help`` lists them."""
    return list(server_info(find_server_bin(binary))["spec_types"])


def server_version(binary: str | None = None) -> str:
    return str(server_info(find_server_bin(binary))["version"])


def server_devices(binary: str | None = None) -> list[str]:
    return list(server_info(find_server_bin(binary))["devices"])
