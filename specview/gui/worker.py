"""The model worker: one long-lived QObject on its own QThread that owns the :class:`Session`.

llama.cpp contexts must not cross threads, so every model load, derivation,
run and diagnosis happens here, and the window only ever sees the typed
signals below, each carrying one small dataclass.

Cancellation is a flag per request, set from the GUI thread and checked by the
arms between forward passes, so a run stops within one forward pass.  The
window cancels the running request before it submits a new one.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from ..core.engine import SpecviewError
from ..core.session import RunConfig, Session
from ..core.trace import Round, Step, Trace

_ids = itertools.count(1)


@dataclass
class RunRequest:
    cfg: RunConfig
    diagnose: bool = True
    reuse_vanilla: bool = True  # False re-runs the vanilla arm even when the session has it cached
    server_bin: str | None = None  # the llama-server engine's binary (None: PATH and friends)
    server_args: str = ""  # extra llama-server flags, verbatim
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


@dataclass
class DeriveRequest:
    """Write ``dst`` as quantization ``quant`` from ``src`` with llama.cpp's quantizer."""

    src: str
    dst: str
    quant: str
    engine: str = "llama.cpp"  # "mlx": an mlx-lm conversion of an unquantized folder into the cache
    id: int = field(default_factory=lambda: next(_ids))


@dataclass
class PreloadRequest:
    """Load (and derive, for demo names) the models of a configuration before the first run."""

    cfg: RunConfig
    id: int = field(default_factory=lambda: next(_ids))


@dataclass
class MatrixRequest:
    """Run every cell of a reproducer matrix on the worker's session (models and vanilla arms are shared)."""

    spec: Any  # specview.core.matrix.MatrixSpec
    out: str | None = None  # the matrix JSON, rewritten after every cell
    traces_dir: str | None = None  # each cell's trace, so a cell opens without running it again
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


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
class ArmStarted:
    request_id: int
    arm: str


@dataclass(frozen=True)
class RunFinished:
    request_id: int
    trace: Trace
    cancelled: bool
    seconds: float
    vanilla_runs: int  # the session's counters after this run
    speculative_runs: int
    loads: int
    diagnosis_error: str | None = None


@dataclass(frozen=True)
class RunFailed:
    request_id: int
    message: str
    kind: str  # the error class name
    details: str = ""  # a traceback for errors that are not SpecviewError


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


def diagnose_function() -> Callable[..., dict] | None:
    """``specview.core.diagnose.diagnose`` when that module is present, else None."""
    try:
        from ..core import diagnose as mod  # type: ignore[attr-defined]
    except ImportError:
        return None
    fn = getattr(mod, "diagnose", None)
    return fn if callable(fn) else None


class ModelWorker(QObject):
    """Owns the session; runs requests one at a time in its own thread."""

    sigRunStarted = Signal(object)  # RunStarted
    sigArmStarted = Signal(object)  # ArmStarted
    sigStep = Signal(object)  # StepEvent
    sigRound = Signal(object)  # RoundEvent
    sigFinished = Signal(object)  # RunFinished
    sigFailed = Signal(object)  # RunFailed
    sigProgress = Signal(object)  # Progress
    sigDerived = Signal(object)  # Derived
    sigPreloaded = Signal(object)  # int request id
    sigMatrixCell = Signal(object)  # MatrixCell
    sigMatrixFinished = Signal(object)  # MatrixFinished

    def __init__(self, session_factory: Callable[[Callable[[str], None]], Session] | None = None):
        super().__init__()
        self._session_factory = session_factory or (lambda progress: Session(progress=progress))
        self.session: Session | None = None
        self._current_id = 0
        self.busy = False

    # -- helpers -----------------------------------------------------------------
    def _progress(self, msg: str) -> None:
        self.sigProgress.emit(Progress(self._current_id, msg))

    def _session(self) -> Session:
        if self.session is None:
            self.session = self._session_factory(self._progress)
        return self.session

    def _fail(self, rid: int, exc: BaseException) -> None:
        if isinstance(exc, SpecviewError):
            self.sigFailed.emit(RunFailed(rid, str(exc), type(exc).__name__))
        else:
            self.sigFailed.emit(RunFailed(
                rid, f"{type(exc).__name__}: {exc}", type(exc).__name__,
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            ))

    # -- slots (called through queued signals from the window) ----------------------
    @Slot(object)
    def run(self, req: RunRequest) -> None:
        if req.cancelled:  # superseded before it started
            return
        self._current_id = req.id
        self.busy = True
        t0 = time.perf_counter()
        try:
            session = self._session()
            self.sigRunStarted.emit(RunStarted(req.id, req.cfg))
            seen: set[str] = set()

            def on_event(arm: str, ev: Any) -> None:
                if arm not in seen:
                    seen.add(arm)
                    self.sigArmStarted.emit(ArmStarted(req.id, arm))
                if isinstance(ev, Step):
                    self.sigStep.emit(StepEvent(req.id, arm, ev))
                elif isinstance(ev, Round):
                    self.sigRound.emit(RoundEvent(req.id, ev))

            if req.cfg.backend == "llama-server":
                # the user's own server: started and stopped by this thread, diagnosed from the outside
                from ..backends.server import run_server_trace

                trace = run_server_trace(req.cfg, server_bin=req.server_bin, server_args=req.server_args,
                                         progress=self._progress, cancel=req.cancel_event.is_set,
                                         on_event=on_event, diagnose=req.diagnose)
            else:
                trace = session.run(req.cfg, on_event=on_event, cancel=req.cancel_event.is_set,
                                    reuse_vanilla=req.reuse_vanilla)
            cancelled = req.cancelled or "cancelled" in (trace.vanilla.stop_reason, trace.speculative.stop_reason)
            diag_error = None
            fn = diagnose_function() if req.cfg.backend != "llama-server" else None
            if req.diagnose and fn is not None and not cancelled:
                self._progress("diagnosing the fork")
                try:
                    result = fn(session, req.cfg, trace, controls=False, progress=self._progress,
                                cancel=req.cancel_event.is_set)
                    if trace.diagnosis is None and isinstance(result, dict):
                        trace.diagnosis = result
                except SpecviewError as exc:
                    diag_error = str(exc)
                except Exception as exc:  # a diagnosis failure must not lose the run
                    diag_error = f"{type(exc).__name__}: {exc}"
                cancelled = cancelled or req.cancelled
            self.sigFinished.emit(RunFinished(
                req.id, trace, cancelled, time.perf_counter() - t0,
                session.vanilla_runs, session.speculative_runs, session.loads, diag_error,
            ))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            self._fail(req.id, exc)
        finally:
            self.busy = False

    @Slot(object)
    def derive(self, req: DeriveRequest) -> None:
        self._current_id = req.id
        self.busy = True
        t0 = time.perf_counter()
        try:
            if req.engine == "mlx":
                from ..backends.mlx import derive_quantized

                self.sigProgress.emit(Progress(req.id, f"deriving {req.quant} from {Path(req.src).name} "
                                                       "with mlx-lm's conversion"))
                bits = int(req.quant.lower().removesuffix("bit"))
                dst = str(derive_quantized(req.src, bits, progress=self._progress))
            else:
                from ..backends.llama_cpp import quantize

                self.sigProgress.emit(Progress(req.id, f"deriving {req.quant} from {Path(req.src).name} -> {req.dst}"))
                Path(req.dst).parent.mkdir(parents=True, exist_ok=True)
                quantize(req.src, req.dst, req.quant)
                dst = req.dst
            self.sigDerived.emit(Derived(req.id, dst, req.quant, time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001
            self._fail(req.id, exc)
        finally:
            self.busy = False

    @Slot(object)
    def preload(self, req: PreloadRequest) -> None:
        self._current_id = req.id
        try:
            s = self._session()
            cfg = req.cfg
            if cfg.backend == "llama-server":  # the server loads its own models when it starts
                self.sigPreloaded.emit(req.id)
                return
            s.model(cfg.backend, cfg.target, cfg.engine)
            if cfg.uses_draft_model and cfg.draft:
                s.model(cfg.backend, cfg.draft, cfg.engine)
            self.sigPreloaded.emit(req.id)
        except BaseException as exc:  # noqa: BLE001
            self._fail(req.id, exc)

    @Slot(object)
    def run_matrix(self, req: MatrixRequest) -> None:
        if req.cancelled:
            return
        self._current_id = req.id
        self.busy = True
        t0 = time.perf_counter()
        try:
            from ..core.matrix import run_matrix

            session = self._session()
            run = run_matrix(req.spec, session, out=req.out, traces_dir=req.traces_dir, progress=self._progress,
                             on_cell=lambda rec: self.sigMatrixCell.emit(MatrixCell(req.id, rec)),
                             cancel=req.cancel_event.is_set)
            self.sigMatrixFinished.emit(MatrixFinished(req.id, run.to_json(), time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            self._fail(req.id, exc)
        finally:
            self.busy = False

    @Slot()
    def shutdown(self) -> None:
        try:
            if self.session is not None:
                self.session.close()
                self.session = None
        finally:
            QThread.currentThread().quit()


class WorkerHost(QObject):
    """Starts the worker thread, forwards requests to it, and stops and joins it."""

    _sigRun = Signal(object)
    _sigDerive = Signal(object)
    _sigPreload = Signal(object)
    _sigMatrix = Signal(object)
    _sigShutdown = Signal()

    def __init__(self, worker: ModelWorker | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.worker = worker or ModelWorker()
        self.thread = QThread()
        self.thread.setObjectName("specview-model-worker")
        self.worker.moveToThread(self.thread)
        self._sigRun.connect(self.worker.run)
        self._sigDerive.connect(self.worker.derive)
        self._sigPreload.connect(self.worker.preload)
        self._sigMatrix.connect(self.worker.run_matrix)
        self._sigShutdown.connect(self.worker.shutdown)
        self.thread.start()
        self.current: RunRequest | MatrixRequest | None = None
        self._stopped = False

    def submit(self, req: RunRequest) -> RunRequest:
        """Cancel whatever is running and queue ``req``."""
        if self.current is not None:
            self.current.cancel()
        self.current = req
        self._sigRun.emit(req)
        return req

    def submit_matrix(self, req: MatrixRequest) -> MatrixRequest:
        """Cancel whatever is running and queue the matrix (a later run cancels it in turn)."""
        if self.current is not None:
            self.current.cancel()
        self.current = req
        self._sigMatrix.emit(req)
        return req

    def cancel(self) -> None:
        if self.current is not None:
            self.current.cancel()

    def derive(self, req: DeriveRequest) -> DeriveRequest:
        self._sigDerive.emit(req)
        return req

    def preload(self, req: PreloadRequest) -> PreloadRequest:
        self._sigPreload.emit(req)
        return req

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Cancel the run, free the models in their own thread, stop the thread and join it."""
        if self._stopped:
            return True
        self._stopped = True
        self.cancel()
        self._sigShutdown.emit()  # the worker frees its models, then quits its own thread
        ok = self.thread.wait(timeout_ms)
        return bool(ok)
