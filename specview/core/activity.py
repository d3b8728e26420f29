"""What the engine is doing right now, in words, for the account of a crash.

Engines call :func:`doing` before every model load and forward pass ("a
4-token pass at position 31 of SmolLM2.Q4_K_M.gguf").  Nothing listens in an
ordinary process; the engine's worker process installs a sink that writes the
text to a small file its parent reads when the worker dies, so the parent can
say what the worker was doing even after a segmentation fault.  ``active`` lets
a hot loop skip formatting the text when nobody listens.
"""

from __future__ import annotations

from typing import Callable

_sink: Callable[[str], None] | None = None
active = False


def doing(text: str) -> None:
    """Record what the engine starts now (a no-op unless a sink is installed)."""
    if _sink is not None:
        _sink(text)


def set_sink(sink: Callable[[str], None] | None) -> None:
    global _sink, active
    _sink = sink
    active = sink is not None
