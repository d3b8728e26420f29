"""Why did the arms fork?  Near-tie flip, state bug, or nondeterminism.

The method (``docs/diagnosis.md`` has the user's version):

* **The serial-verify control** (:mod:`.controls`).  The speculative loop is
  run again with every verify pass computed as single-token passes, one per
  row, on the same context.  Every KV entry and every row is then computed
  exactly as vanilla computes it, so a correct loop on a deterministic backend
  reproduces vanilla token for token: if it does, the fork is proven to come
  from batched-versus-single numerics; if it does not (and vanilla repeats
  itself), the loop or its cache is wrong.  No threshold is involved.
* **Two teacher-forced replays, on fresh contexts, in lockstep**
  (:mod:`.replays`): the shared prefix one token per pass (the vanilla shape)
  and the speculative arm's own recorded batches and truncations.  Each must
  give back what its arm recorded; one that does not is replayed again to tell
  a dirty context (``state``) from nondeterminism.
* **The envelope and the gap**: how far the two shapes move logits before the
  fork, and logit(a) - logit(b) at the fork.  Supporting numbers, and the rule
  for engines where the serial-verify control cannot run (:mod:`.classify`).
* **The backend check** (:mod:`specview.core.diagnose.reference`), when it runs, first:
  a backend that computes the model wrongly is flagged before any fork is read.

Everything runs on the :class:`~specview.core.session.Session`'s already
loaded models; nothing is loaded twice.
"""

from __future__ import annotations

from .classify import (CONTROL_CHUNK, FAR_FACTOR, FAR_FLOOR, LOGIT_TOL, SCHEMA_VERSION, VERDICTS,
                       DiagnosisCancelled, at_risk_positions, classify, envelope_stats, far_threshold, rank_of)
from .controls import SERIAL_FORMS, control_matrix, serial_verify_control, vanilla_repeat
from .fork import diagnose, fork_fields, fork_of, require_complete
from .words import departure_line, explain, format_verdict, reference_line, serial_line

__all__ = [
    "departure_line",
    "diagnose",
    "fork_fields",
    "fork_of",
    "require_complete",
    "format_verdict",
    "classify",
    "envelope_stats",
    "far_threshold",
    "at_risk_positions",
    "rank_of",
    "explain",
    "serial_line",
    "reference_line",
    "serial_verify_control",
    "vanilla_repeat",
    "control_matrix",
    "DiagnosisCancelled",
    "VERDICTS",
    "SERIAL_FORMS",
    "LOGIT_TOL",
    "FAR_FACTOR",
    "FAR_FLOOR",
    "CONTROL_CHUNK",
    "SCHEMA_VERSION",
]
