"""One fact about the setup specview runs on, as ``specview doctor`` and the app's "About this setup" show it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: statuses, in order of concern
STATUSES = ("ok", "info", "warn", "problem")


@dataclass(frozen=True)
class Fact:
    """One line of the setup report."""

    topic: str  # "llama.cpp", "mlx", "llama-server", "machine"
    name: str  # short key: "version", "devices", "offload" ...
    value: Any  # what was found (JSON-able)
    text: str  # the sentence a user reads
    status: str = "ok"  # ok / info / warn / problem
    advice: str | None = None  # what to do about a warn or problem
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
