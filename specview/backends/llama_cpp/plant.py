"""A planted crash probe: this machine decides what a CPU whose repacked kernels crash decides.

``$SPECVIEW_REPACK_PROBE`` plants the AMX probe's result (:mod:`.probe`) on any
CPU.  ``crashed``: runs default to no repack, as on an Intel Xeon with AMX, and a
model load that still gets repacked weights (a ``CPU_REPACK`` buffer, which
llama.cpp names in its load log) fails at once, as its first multi-token pass
would there.  ``ok``: a probe that ran fine.  The test suite runs once more with
``crashed`` (``.ci/run``), so a test or a code path that loads a model past the
resolution fails on every CPU, not only on the ones that crash.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...core.errors import SpecviewError

#: plants the probe's result (``crashed`` or ``ok``) on any CPU; unset: the probe decides where it is needed
PLANT_VARIABLE = "SPECVIEW_REPACK_PROBE"
PLANT_VALUES = ("crashed", "ok")
PROBE_TOKENS = 4


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
    """Where the probe's crash is planted, a load whose weights went to a repacked buffer (``CPU_REPACK`` in
    llama.cpp's load log) fails now, as the first multi-token pass on it would on a CPU whose repacked kernels
    crash: a load that did not take this machine's no-repack decision is found on every CPU."""
    if planted() != "crashed":
        return
    bufs = [ln.strip() for ln in log if "CPU_REPACK" in ln and "buffer" in ln]
    if bufs:
        raise SpecviewError(
            f"{Path(path).name} was loaded with repacked weights ({bufs[0]}) although ${PLANT_VARIABLE}=crashed "
            "plants a CPU whose repacked kernels crash: load it through the resolution (the machine's no_repack "
            "decision), or pass --no-repack")
