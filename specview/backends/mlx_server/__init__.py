"""The ``mlx-server`` engine: the user's own ``mlx_lm.server``, both arms, and a diagnosis from the outside.

specview starts ``mlx_lm.server`` on 127.0.0.1 with the user's flags, twice:
on the target alone (the vanilla arm) and on the target with
``--draft-model`` (the speculative arm, ``num_draft_tokens`` = n_max per
request).  Both get the same greedy request with ``logprobs`` and the server's
capped ``top_logprobs``; the token sequences are compared as for every engine.
A fork is diagnosed by re-running mlx-lm's own loops in process on the same
folders.  ``docs/mlx-server.md`` is the user's version.

* :mod:`.process` -- the program, its flags, readiness (:class:`MLXServer`).
* :mod:`.protocol` -- requests, answers, the top-logprob cap, what is not reported.
* :mod:`.runner` -- runs and traces (:class:`MLXServerRunner`).
* :mod:`.diagnose` -- the diagnosis from the outside.
* :mod:`.backend` -- :class:`MLXServerBackend`, registered as ``mlx-server``.

The process lifetime (no orphans) and the OpenAI-compatible bodies are shared
with the llama-server engine: :mod:`specview.backends.local_server`.
"""

from __future__ import annotations

from .backend import SPEC_TYPES, MLXServerBackend

__all__ = ["MLXServerBackend", "SPEC_TYPES"]
