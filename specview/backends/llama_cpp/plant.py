"""A planted crash probe: this machine decides what a CPU whose repacked kernels crash decides.

``$SPECVIEW_REPACK_PROBE`` plants the AMX probe's result (:mod:`.probe`) on any
CPU.  ``crashed``: runs default to no repack, as on an Intel Xeon with AMX, and a
model load that still gets repacked weights (a ``CPU_REPACK`` or ``AMX`` buffer,
which llama.cpp names in its load log) fails at once, as its first multi-token pass
would there.  ``ok``: a probe that ran fine.  The test suite runs once more with
``crashed`` (``.ci/run``), so a test or a code path that loads a model past the
resolution fails on every CPU, not only on the ones that crash.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ...core.config import REPACKED_BUFFERS
from ...core.errors import SpecviewError

#: plants the probe's result (``crashed`` or ``ok``) on any CPU; unset: the probe decides where it is needed
PLANT_VARIABLE = "SPECVIEW_REPACK_PROBE"
PLANT_VALUES = ("crashed", "ok")
PROBE_TOKENS = 4


def repacked_buffer_line(line: str) -> bool:
    """Whether a line of llama.cpp's load log names a weight buffer of a repacked layout."""
    return any(f"{b} model buffer size" in line for b in REPACKED_BUFFERS)
#: ``general.file_type`` values whose weights no CPU backend repacks (all F32, mostly F16, mostly BF16)
UNPACKED_FILE_TYPES = (0, 1, 32)


def planted() -> str | None:
    """The probe result ``$SPECVIEW_REPACK_PROBE`` plants (``crashed`` / ``ok``), or None; any other value is an
    error that names the variable, never a silent fall back to the real probe."""
    value = os.environ.get(PLANT_VARIABLE, "").strip().lower()
    if not value:
        return None
    if value not in PLANT_VALUES:
        raise SpecviewError(f"${PLANT_VARIABLE}={os.environ[PLANT_VARIABLE]!r}: must be one of "
                            f"{', '.join(PLANT_VALUES)} (or unset, to let the probe decide)")
    return value


def planted_result() -> dict[str, Any] | None:
    """The probe's result as ``$SPECVIEW_REPACK_PROBE`` plants it, or None when it plants nothing."""
    value = planted()
    if value is None:
        return None
    out: dict[str, Any] = {"crashed": value == "crashed", "planted": True, "n_tokens": PROBE_TOKENS,
                           "message": f"planted by ${PLANT_VARIABLE}={value}"}
    if value == "crashed":
        out.update(signal="SIGSEGV", exitcode=None, known_cause="amx")
    return out


def check_repacked_load(path: str | os.PathLike[str], log: list[str]) -> None:
    """Where the probe's crash is planted, a load whose weights went to a repacked buffer (``CPU_REPACK`` or
    ``AMX`` in llama.cpp's load log) fails now, as the first multi-token pass on it would on a CPU whose repacked kernels
    crash: a load that did not take this machine's no-repack decision is found on every CPU."""
    if planted() != "crashed":
        return
    bufs = [ln.strip() for ln in log if repacked_buffer_line(ln)]
    if bufs:
        raise SpecviewError(
            f"{Path(path).name} was loaded with repacked weights ({bufs[0]}) although ${PLANT_VARIABLE}=crashed "
            "plants a CPU whose repacked kernels crash: load it through the resolution (the machine's no_repack "
            "decision), or pass --no-repack")


def check_server_repack(args: Sequence[str]) -> None:
    """Where the probe's crash is planted, a llama-server started on quantized weights without ``--no-repack``
    fails: it would repack them (its log does not name the buffers at its default verbosity, so the file's
    type says it), and on a CPU whose repacked kernels crash it would die on its first multi-token pass."""
    if planted() != "crashed" or "--no-repack" in args or "-nr" in args:
        return
    from ...core.models.gguf import read

    for flag in ("-m", "-md"):
        if flag not in args or args.index(flag) + 1 >= len(args):
            continue
        path = args[args.index(flag) + 1]
        try:
            file_type = read(path).get("general.file_type")
        except Exception:  # unreadable: the server says what is wrong with it
            continue
        if isinstance(file_type, int) and file_type not in UNPACKED_FILE_TYPES:
            raise SpecviewError(
                f"llama-server would repack the quantized weights of {Path(path).name} (no --no-repack) although "
                f"${PLANT_VARIABLE}=crashed plants a CPU whose repacked kernels crash: start it through the "
                "resolution (the machine's no_repack decision), or pass --no-repack")
