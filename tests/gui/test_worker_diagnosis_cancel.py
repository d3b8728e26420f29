"""A cancel while the diagnosis runs cancels the diagnosis alone: the model worker reports the run as finished,
not cancelled, with the diagnosis marked cancelled by the user; a cancel of the arms is still a cancelled run."""

from __future__ import annotations

import pytest
from synthetic import synthetic_trace

from specview.core.config import RunConfig
from specview.core.diagnose import DiagnosisCancelled
from specview.core.errors import SpecviewError
from specview.gui.messages import RunRequest
from specview.gui.verdict_bar import DIAGNOSIS_CANCELLED, trace_verdict
from specview.gui.worker import ModelWorker


class StubRunner:
    """A runner whose arms finish at once (forked at token 25) and whose diagnosis does what ``diagnose`` says."""

    vanilla_runs = speculative_runs = loads = 1

    def __init__(self, diagnose):
        self._diagnose = diagnose
        self.trace = synthetic_trace(fork=25)

    def run(self, cfg, *, on_event=None, cancel=None, reuse_vanilla=True):
        return self.trace

    def diagnose(self, trace, cfg, *, controls=False, progress=None, cancel=None):
        return self._diagnose(cancel)

    def close(self):
        pass


def _finish(diagnose):
    cfg = RunConfig(target="demo:Q4_K_M", draft="demo:Q4_0", prompt="hi", max_tokens=40)
    req = RunRequest(cfg)
    worker = ModelWorker()
    worker.runners[cfg.backend] = StubRunner(lambda cancel: diagnose(req, cancel))
    finished, failed = [], []
    worker.sigFinished.connect(finished.append)
    worker.sigFailed.connect(failed.append)
    worker.run(req)
    assert not failed and len(finished) == 1
    return finished[0]


def _cancelled_by_user(req, cancel):
    req.cancel()  # the user's Esc while the replays run
    assert cancel()
    raise DiagnosisCancelled("diagnosis cancelled")


def test_a_cancel_during_the_diagnosis_keeps_the_run_finished(qapp):
    ev = _finish(_cancelled_by_user)
    assert ev.cancelled is False  # both arms had finished: the run was not cancelled
    assert ev.diagnosis_error == DIAGNOSIS_CANCELLED and ev.trace.diagnosis is None
    text, _ = trace_verdict(ev.trace, cancelled=ev.cancelled, diagnosis_error=ev.diagnosis_error)
    assert text.startswith("<b>Forked at token 25</b>") and "not classified" in text
    assert "Cancelled after" not in text and "diagnosis failed" not in text


def test_an_error_the_cancel_caused_is_a_cancelled_diagnosis(qapp):
    def broken_by_the_cancel(req, cancel):
        req.cancel()
        raise SpecviewError("the replay's context was freed")

    ev = _finish(broken_by_the_cancel)
    assert ev.cancelled is False and ev.diagnosis_error == DIAGNOSIS_CANCELLED


@pytest.mark.parametrize("exc,words", [(SpecviewError("replay ran out of context"), "replay ran out of context"),
                                       (ValueError("bad shape"), "ValueError: bad shape")])
def test_a_diagnosis_that_fails_unasked_is_a_failure(qapp, exc, words):
    def fails(req, cancel):
        raise exc

    ev = _finish(fails)
    assert ev.cancelled is False and ev.diagnosis_error == words


def test_a_finished_diagnosis_is_kept(qapp):
    ev = _finish(lambda req, cancel: {"verdict": "near-tie", "explanation": "a near-tie"})
    assert ev.cancelled is False and ev.diagnosis_error is None
    assert ev.trace.diagnosis == {"verdict": "near-tie", "explanation": "a near-tie"}
