"""The model worker: one long-lived QObject on its own QThread that owns the engine's runner.

Every run, matrix and diagnosis goes through the runner of the chosen engine,
``get_backend(cfg.backend).runner(progress=...)`` (for the in-process engines a proxy
whose :class:`~specview.core.session.Session` lives in a worker process, a server runner for
llama-server, a plug-in's own):
the worker never asks which engine it is.  llama.cpp contexts must not cross
threads, so every model load, derivation, run and diagnosis happens here, and
the window only ever sees the typed signals below, each carrying one small
dataclass (:mod:`specview.gui.messages`, with the requests the window submits).  The runner of one engine is kept between requests (its models and
cached vanilla arms are reused); choosing another engine closes it.

Tokens are sent to the window in batches (:class:`StepsEvent`, at most about
every ``BATCH_S`` seconds), so the GUI thread wakes about twenty times a second
instead of once per token; ``sigStep`` still carries every token on its own for
observers.

Cancellation is a flag per request, set from the GUI thread and checked by the
arms between forward passes, so a run stops within one forward pass.  The
window cancels the running request before it submits a new one.  A cancel
while the diagnosis runs (both arms finished) cancels the diagnosis alone: the
run is reported as finished, not cancelled, its ``diagnosis_error``
:data:`~specview.gui.verdict_bar.DIAGNOSIS_CANCELLED`.

The kernel map and the prescription (:mod:`specview.core.kernels.map`,
:mod:`specview.core.matrix.prescribe`) run here too, on the Session of their
in-process engine: they report a fraction and a line of text
(:class:`Progress`), and end in :class:`KernelMapFinished` /
:class:`PrescriptionFinished` (``cancelled`` and no result when cancelled) or
in :class:`RunFailed` through ``sigFailed``.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from ..core.diagnose.classify import DiagnosisCancelled
from ..core.errors import Cancelled, EngineCrashed, SpecviewError
from ..core.registry import Runner, get_backend
from ..core.trace import Round, Step, Trace
from .models import choices as gmodels
from .messages import (ArmStarted, Derived, DeriveRequest, JobFinished, JobRequest, KernelMapFinished, KernelMapRequest,
                       MatrixCell, MatrixFinished, MatrixRequest, PreloadRequest, PrescriptionFinished,
                       PrescriptionRequest, Progress, RoundEvent, RunFailed, RunFinished, RunRequest, RunStarted,
                       StepEvent, StepsEvent)
from .verdict_bar import DIAGNOSIS_CANCELLED

BATCH_S = 0.05  # tokens reach the window at most this long after they were made (a frame is longer)


class ModelWorker(QObject):
    """Owns the runner of the chosen engine; runs requests one at a time in its own thread."""

    sigRunStarted = Signal(object)  # RunStarted
    sigArmStarted = Signal(object)  # ArmStarted
    sigStep = Signal(object)  # StepEvent, one per token
    sigRound = Signal(object)  # RoundEvent, one per speculative round
    sigSteps = Signal(object)  # StepsEvent, a batch of tokens and rounds
    sigDiagnosing = Signal(object)  # RunStarted: both arms are done, the diagnosis runs
    sigFinished = Signal(object)  # RunFinished
    sigFailed = Signal(object)  # RunFailed
    sigProgress = Signal(object)  # Progress
    sigDerived = Signal(object)  # Derived
    sigPreloaded = Signal(object)  # int request id
    sigMatrixCell = Signal(object)  # MatrixCell
    sigMatrixFinished = Signal(object)  # MatrixFinished
    sigKernelMapFinished = Signal(object)  # KernelMapFinished
    sigPrescriptionFinished = Signal(object)  # PrescriptionFinished
    sigJobFinished = Signal(object)  # JobFinished

    def __init__(self) -> None:
        super().__init__()
        self.runners: dict[str, Runner] = {}
        self._current_id = 0
        self.busy = False

    @property
    def runner(self) -> Runner | None:
        """The runner of the engine used last (None before the first request that needed one)."""
        return next(iter(self.runners.values()), None)

    # -- helpers -----------------------------------------------------------------
    def _progress(self, msg: str) -> None:
        self.sigProgress.emit(Progress(self._current_id, msg))

    def runner_for(self, engine: str) -> Runner:
        """The runner of ``engine``, made on first use; another engine's runner is closed first."""
        r = self.runners.get(engine)
        if r is None:
            self.close_runners()
            r = get_backend(engine).runner(progress=self._progress)
            self.runners[engine] = r
        return r

    def close_runners(self) -> None:
        runners, self.runners = list(self.runners.values()), {}
        for r in runners:
            r.close()

    def _fail(self, rid: int, exc: BaseException) -> None:
        if isinstance(exc, EngineCrashed):
            self.sigFailed.emit(RunFailed(rid, str(exc), type(exc).__name__, crash=exc.crash,
                                          trace=exc.trace if isinstance(exc.trace, Trace) else None))
        elif isinstance(exc, SpecviewError):
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
        batch = _Batcher(self, req.id)
        try:
            runner = self.runner_for(req.cfg.backend)
            self.sigRunStarted.emit(RunStarted(req.id, req.cfg))
            trace = runner.run(req.cfg, on_event=batch.on_event, cancel=req.cancel_event.is_set,
                               reuse_vanilla=req.reuse_vanilla)
            batch.flush()
            # cancelled means the arms were: a cancel during the diagnosis cancels the diagnosis alone
            cancelled = req.cancelled or "cancelled" in (trace.vanilla.stop_reason, trace.speculative.stop_reason)
            diag_error = None
            if req.diagnose and not cancelled and trace.diagnosis is None:
                diag_error = self._diagnose(req, runner, trace)
            self.sigFinished.emit(RunFinished(
                req.id, trace, cancelled, time.perf_counter() - t0,
                runner.vanilla_runs, runner.speculative_runs, runner.loads, diag_error,
            ))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            batch.flush()
            self._fail(req.id, exc)
        finally:
            self.busy = False

    def _diagnose(self, req: RunRequest, runner: Runner, trace: Trace) -> str | None:
        """Diagnose ``trace``, whose arms both finished; why it has no diagnosis, or None.

        A cancel while the diagnosis runs gives :data:`~specview.gui.verdict_bar.DIAGNOSIS_CANCELLED`: the
        run itself stands as it finished, only its fork is not classified.
        """
        self.sigDiagnosing.emit(RunStarted(req.id, req.cfg))
        self._progress("diagnosing the fork" if not trace.comparison.identical else "diagnosing the run")
        try:
            result = runner.diagnose(trace, req.cfg, controls=False, progress=self._progress,
                                     cancel=req.cancel_event.is_set)
        except (Cancelled, DiagnosisCancelled):
            return DIAGNOSIS_CANCELLED
        except Exception as exc:  # a diagnosis failure must not lose the run
            if req.cancelled:  # what the cancel broke on its way out
                return DIAGNOSIS_CANCELLED
            return str(exc) if isinstance(exc, SpecviewError) else f"{type(exc).__name__}: {exc}"
        if trace.diagnosis is None and isinstance(result, dict):
            trace.diagnosis = result
        return None

    @Slot(object)
    def derive(self, req: DeriveRequest) -> None:
        self._current_id = req.id
        self.busy = True
        t0 = time.perf_counter()
        try:
            dst = gmodels.derive(req.choice, req.model_kind, progress=self._progress)
            self.sigDerived.emit(Derived(req.id, dst, req.choice.quant, time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001
            self._fail(req.id, exc)
        finally:
            self.busy = False

    @Slot(object)
    def preload(self, req: PreloadRequest) -> None:
        self._current_id = req.id
        try:
            cfg = req.cfg
            # in-process engines load now (in their worker process); a server loads its models when it starts
            self.runner_for(cfg.backend).preload(cfg)
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

            runner = self.runner_for(req.spec.backend)
            run = run_matrix(req.spec, runner, out=req.out, traces_dir=req.traces_dir, progress=self._progress,
                             on_cell=lambda rec: self.sigMatrixCell.emit(MatrixCell(req.id, rec)),
                             cancel=req.cancel_event.is_set)
            self.sigMatrixFinished.emit(MatrixFinished(req.id, run.to_json(), time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            self._fail(req.id, exc)
        finally:
            self.busy = False

    def _session_for(self, backend: str) -> Runner | None:
        """The runner of an in-process engine (its Session lives in a worker process); None for any other,
        whose refusal the core words."""
        return self.runner_for(backend) if get_backend(backend).in_process else None

    def _fraction_reporter(self, rid: int) -> tuple[Any, Any]:
        """(progress(text), on_fraction(f)) for one request: a line of text, the fraction at most every BATCH_S."""
        state = {"msg": "", "f": None, "sent": 0.0}

        def text(msg: str) -> None:
            state["msg"] = msg
            self.sigProgress.emit(Progress(rid, msg, state["f"]))

        def fraction(f: float) -> None:
            state["f"] = f
            now = time.perf_counter()
            if now - state["sent"] >= BATCH_S or f >= 1.0:
                state["sent"] = now
                self.sigProgress.emit(Progress(rid, state["msg"], f))

        return text, fraction

    def _job(self, req: Any, work: Any, finished: Any, signal: Any) -> None:
        """Run ``work(text, fraction)`` for ``req``; emit ``finished(id, result, cancelled, seconds)`` on
        ``signal`` (the result None when the job was cancelled), or the failure."""
        if req.cancelled:
            return
        self._current_id = req.id
        self.busy = True
        t0 = time.perf_counter()
        try:
            from ..core.errors import Cancelled

            text, fraction = self._fraction_reporter(req.id)
            try:
                result = work(text, fraction)
            except Cancelled:
                result = None
            signal.emit(finished(req.id, result, result is None, time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            self._fail(req.id, exc)
        finally:
            self.busy = False

    @Slot(object)
    def kernel_map(self, req: KernelMapRequest) -> None:
        def work(text: Any, fraction: Any) -> Any:
            from ..core.kernels.map import kernel_map

            return kernel_map(self._session_for(req.backend), req.targets, req.prompts, req.widths, req.positions,
                              req.settings, backend=req.backend, progress=text, cancel=req.cancel_event.is_set,
                              on_fraction=fraction, stop_at_difference=req.stop_at_difference)

        self._job(req, work, KernelMapFinished, self.sigKernelMapFinished)

    @Slot(object)
    def prescribe(self, req: PrescriptionRequest) -> None:
        def work(text: Any, _fraction: Any) -> Any:
            from ..core.matrix.prescribe import prescribe

            kw: dict[str, Any] = {}
            if req.candidates is not None:
                kw["candidates"] = req.candidates
            if req.max_tokens is not None:
                kw["max_tokens"] = req.max_tokens
            session = self._session_for(req.kmap.backend)
            if session is None:
                from ..core.errors import BackendUnavailable

                raise BackendUnavailable(f"the prescription runs both arms in this process, on the engine the map "
                                         f"was made with ({req.kmap.backend}), and that engine does not; map and "
                                         "prescribe with llama.cpp or mlx")
            return prescribe(session, req.kmap, draft=req.draft, progress=text, cancel=req.cancel_event.is_set, **kw)

        self._job(req, work, PrescriptionFinished, self.sigPrescriptionFinished)

    @Slot(object)
    def run_job(self, req: JobRequest) -> None:
        self._job(req, lambda text, fraction: req.work(self.runner_for(req.backend), text, fraction,
                                                       req.cancel_event.is_set), JobFinished, self.sigJobFinished)

    @Slot()
    def shutdown(self) -> None:
        try:
            self.close_runners()
        finally:
            QThread.currentThread().quit()


class _Batcher:
    """Collects one run's events on the worker thread and sends them on in batches."""

    def __init__(self, worker: ModelWorker, rid: int):
        self.w, self.rid = worker, rid
        self.arm: str | None = None
        self.steps: list[Step] = []
        self.rounds: list[Round] = []
        self.sent = time.perf_counter()

    def on_event(self, arm: str, ev: Any) -> None:
        if arm != self.arm:
            self.flush()
            self.arm = arm
            self.w.sigArmStarted.emit(ArmStarted(self.rid, arm))
        if isinstance(ev, Step):
            self.steps.append(ev)
            self.w.sigStep.emit(StepEvent(self.rid, arm, ev))
        elif isinstance(ev, Round):
            self.rounds.append(ev)
            self.w.sigRound.emit(RoundEvent(self.rid, ev))
        now = time.perf_counter()
        if now - self.sent >= BATCH_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.arm is not None and (self.steps or self.rounds):
            self.w.sigSteps.emit(StepsEvent(self.rid, self.arm, self.steps, self.rounds))
            self.steps, self.rounds = [], []
        self.sent = now if now is not None else time.perf_counter()


class WorkerHost(QObject):
    """Starts the worker thread, forwards requests to it, and stops and joins it."""

    _sigRun = Signal(object)
    _sigDerive = Signal(object)
    _sigPreload = Signal(object)
    _sigMatrix = Signal(object)
    _sigKernelMap = Signal(object)
    _sigPrescribe = Signal(object)
    _sigJob = Signal(object)
    _sigShutdown = Signal()
    #: a request was queued (after the one running was cancelled): a view that was waiting for another lets go
    sigSubmitted = Signal(object)

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
        self._sigKernelMap.connect(self.worker.kernel_map)
        self._sigPrescribe.connect(self.worker.prescribe)
        self._sigJob.connect(self.worker.run_job)
        self._sigShutdown.connect(self.worker.shutdown)
        self.thread.start()
        self.current: Any = None  # the request running (or queued) last: a submit cancels it
        self._stopped = False

    def _submit(self, req: Any, queue: Any) -> Any:
        if self.current is not None:
            self.current.cancel()
        self.current = req
        queue.emit(req)
        self.sigSubmitted.emit(req)
        return req

    def submit(self, req: RunRequest) -> RunRequest:
        """Cancel whatever is running and queue ``req``."""
        return self._submit(req, self._sigRun)

    def submit_matrix(self, req: MatrixRequest) -> MatrixRequest:
        """Cancel whatever is running and queue the matrix (a later run cancels it in turn)."""
        return self._submit(req, self._sigMatrix)

    def submit_kernel_map(self, req: KernelMapRequest) -> KernelMapRequest:
        """Cancel whatever is running and queue the kernel map (a later request cancels it in turn)."""
        return self._submit(req, self._sigKernelMap)

    def submit_prescription(self, req: PrescriptionRequest) -> PrescriptionRequest:
        """Cancel whatever is running and queue the prescription (a later request cancels it in turn)."""
        return self._submit(req, self._sigPrescribe)

    def submit_job(self, req: JobRequest) -> JobRequest:
        """Cancel whatever is running and queue a view's own job (a later request cancels it in turn)."""
        return self._submit(req, self._sigJob)

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
