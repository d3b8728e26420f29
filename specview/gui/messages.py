"""What the window and its model worker say to each other: a request the window submits (cancellable where it
runs long) and the events the worker sends back, each one small dataclass carried by one typed signal of
:class:`~specview.gui.worker.ModelWorker`.  Plain dataclasses (no Qt of their own), so a view that only submits or
reads them imports no worker."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from ..core.config import RunConfig
from ..core.trace import Round, Step, Trace
from .models import choices as gmodels

_ids = itertools.count(1)


class _Cancellable:
    cancel_event: threading.Event

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


@dataclass
class RunRequest(_Cancellable):
    cfg: RunConfig
    diagnose: bool = True
    reuse_vanilla: bool = True  # False re-runs the vanilla arm even when the runner has it cached
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class DeriveRequest:
    """Write the missing quantization ``choice`` of a model of kind ``model_kind`` ("gguf" or "folder")."""

    choice: gmodels.QuantChoice
    model_kind: str = "gguf"
    id: int = field(default_factory=lambda: next(_ids))


@dataclass
class PreloadRequest:
    """Load (and derive, for demo names) the models of a configuration before the first run."""

    cfg: RunConfig
    id: int = field(default_factory=lambda: next(_ids))


@dataclass
class MatrixRequest(_Cancellable):
    """Run every cell of a reproducer matrix on the runner of the matrix's engine."""

    spec: Any  # specview.core.matrix.MatrixSpec
    out: str | None = None  # the matrix JSON, rewritten after every cell
    traces_dir: str | None = None  # each cell's trace, so a cell opens without running it again
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class KernelMapRequest(_Cancellable):
    """Compute a kernel map (:func:`specview.core.kernels.map.kernel_map`) on the engine's Session."""

    targets: list[str]
    prompts: list[Any]  # PromptSpecs, built-in names, texts or token-id lists
    widths: tuple[int, ...]
    positions: int
    settings: Any  # EngineSettings, or a list of them (one map row per target and settings)
    backend: str = "llama.cpp"
    stop_at_difference: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class PrescriptionRequest(_Cancellable):
    """Run :func:`specview.core.matrix.prescribe.prescribe` on a kernel map, on the Session of the map's engine."""

    kmap: Any  # specview.core.kernels.map.KernelMap
    draft: str
    candidates: tuple[int, ...] | None = None  # None: prescribe's defaults
    max_tokens: int | None = None
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class JobRequest(_Cancellable):
    """A view's own long work on the runner of ``backend``: ``work(runner, progress, fraction, cancel)`` runs on the
    worker thread, like a matrix, and its result comes back in :class:`JobFinished` (None when cancelled)."""

    backend: str
    work: Any  # Callable[[Runner, Callable[[str], None], Callable[[float], None], Callable[[], bool]], Any]
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass(frozen=True)
class JobFinished:
    request_id: int
    result: Any
    cancelled: bool
    seconds: float


@dataclass(frozen=True)
class KernelMapFinished:
    request_id: int
    kmap: Any  # KernelMap, or None when cancelled
    cancelled: bool
    seconds: float


@dataclass(frozen=True)
class PrescriptionFinished:
    request_id: int
    prescription: Any  # specview.core.matrix.prescribe.Prescription, or None when cancelled
    cancelled: bool
    seconds: float


@dataclass(frozen=True)
class MatrixCell:
    """One finished matrix cell: its ``specview.matrix/1`` cell record."""

    request_id: int
    record: dict


@dataclass(frozen=True)
class MatrixFinished:
    request_id: int
    doc: dict  # the whole matrix document, status "complete" or "interrupted"
    seconds: float


@dataclass(frozen=True)
class RunStarted:
    request_id: int
    cfg: RunConfig


@dataclass(frozen=True)
class StepEvent:
    request_id: int
    arm: str  # "vanilla" or "speculative"
    step: Step


@dataclass(frozen=True)
class RoundEvent:
    request_id: int
    round: Round


@dataclass(frozen=True)
class StepsEvent:
    """The tokens (and speculative rounds) one arm made since the last batch, in order."""

    request_id: int
    arm: str
    steps: list[Step]
    rounds: list[Round]


@dataclass(frozen=True)
class ArmStarted:
    request_id: int
    arm: str


@dataclass(frozen=True)
class RunFinished:
    request_id: int
    trace: Trace
    cancelled: bool
    seconds: float
    vanilla_runs: int  # the runner's counters after this run
    speculative_runs: int
    loads: int
    diagnosis_error: str | None = None


@dataclass(frozen=True)
class RunFailed:
    request_id: int
    message: str
    kind: str  # the error class name
    details: str = ""  # a traceback for errors that are not SpecviewError
    crash: dict | None = None  # the engine's worker died: the account (specview.core.worker.death)
    trace: Trace | None = None  # ... and the run it had computed, its arms stopped "crashed"


@dataclass(frozen=True)
class Progress:
    request_id: int
    message: str
    fraction: float | None = None  # None: indeterminate


@dataclass(frozen=True)
class Derived:
    request_id: int
    path: str
    quant: str
    seconds: float
