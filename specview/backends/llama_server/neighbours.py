"""Two requests in flight on one llama-server: does a neighbour request change my answer?

llama-server with ``-np 2`` has two slots and decodes the tokens of both in one
batch (continuous batching): a neighbour's request changes the composition of
every pass my request takes, and it is where a cross-sequence leak would show
(llama.cpp #28019).  :func:`alone_and_beside` starts (or reuses) a two-slot
server for the run's target, without a drafter, and asks it for my greedy answer
twice: alone, then while a neighbour request (another prompt, a longer answer) is
streaming on the other slot.  The neighbour is in flight before my request is
sent (its first token has arrived) and is still generating when my answer comes
back (it may fill its slot's context), which the result records; then it is
dropped.

The same on a server with ``-ub 1`` is the control: every token its own
micro-batch, so batch composition cannot move a logit, and only a leak can make
the two answers differ.  Each slot keeps its own KV cache where the binary can
(``--no-kv-unified``), so my cells are laid out alone or beside alike.

:func:`endpoint` is the seam between the probe and the server's HTTP answers
(the server itself by default); a planted leak is a proxy there.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from ...core.config import RunConfig
from ...core.errors import Cancelled
from ..local_server.process import ServerError
from .pool import with_ubatch
from .process import LlamaServer
from .protocol import completion_body, wait_idle

#: each slot's context: the neighbour may generate until it is full, so it is still generating when mine ends
#: (on a tiny model a few hundred tokens take well under a second); it is dropped once my answer is back
SLOT_CTX = 4096
SLOTS = 2


def endpoint(server: LlamaServer) -> Any:
    """What the probe's requests go to: the server (a planted leak replaces this with a proxy of its own)."""
    return server


def two_slot_argv(argv: Sequence[str], info: dict[str, Any], n_ctx: int) -> list[str]:
    """``argv`` with ``-np 2``, a context of ``n_ctx`` per slot and, where the binary has it, one KV cache per slot."""
    out = list(argv)
    if "-np" in out:
        out[out.index("-np") + 1] = str(SLOTS)
    else:
        out += ["-np", str(SLOTS)]
    if "-c" in out:
        out[out.index("-c") + 1] = str(n_ctx * SLOTS)
    else:
        out += ["-c", str(n_ctx * SLOTS)]
    flags = info.get("help_flags") or ()
    if "--no-kv-unified" in flags and "--no-kv-unified" not in out and "-kvu" not in out:
        out.append("--no-kv-unified")
    return out


def _answer(srv: Any, prompt: Sequence[int], n: int, ignore_eos: bool, cancel: Callable[[], bool]) -> dict[str, Any]:
    body = completion_body(prompt, n, n_probs=2, ignore_eos=ignore_eos)
    resp = srv.post("/completion", body, cancel=cancel)
    toks = resp.get("tokens")
    if not isinstance(toks, list):
        raise ServerError(f"{getattr(srv, 'name', 'llama-server')} answered without token ids")
    return {"tokens": [int(t) for t in toks], "slot": resp.get("id_slot"),
            "timings": resp.get("timings") or {}}


class Neighbour:
    """The neighbour request, streaming on a thread of its own; what it generated and when."""

    def __init__(self, srv: Any, prompt: Sequence[int], n: int, ignore_eos: bool):
        self.srv, self.body = srv, dict(completion_body(prompt, n, n_probs=0, ignore_eos=ignore_eos), stream=True)
        self.n = n
        self.times: list[float] = []  # arrival time of each streamed token
        self.finished = False
        self.error: BaseException | None = None
        self.started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specview-neighbour", daemon=True)

    def _run(self) -> None:
        try:
            for ev in self.srv.stream("/completion", self.body, cancel=self._stop.is_set, stop_on_cancel=False):
                if not isinstance(ev, dict):
                    continue
                if ev.get("stop"):
                    self.finished = True
                    break
                if ev.get("tokens"):
                    self.times.append(time.monotonic())
                    self.started.set()
        except Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the probe's thread
            self.error = exc
        finally:
            self.started.set()

    def start(self, timeout: float = 120.0) -> None:
        self._thread.start()
        if not self.started.wait(timeout) or self.error is not None:
            raise ServerError(f"the neighbour request did not start generating ({self.error or 'timeout'})")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def during(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.times if t0 <= t <= t1)


def alone_and_beside(runner: Any, cfg: RunConfig, *, other: Sequence[int], ubatch: int | None = None,
                     repeat_alone: bool = False, cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
    """My plain greedy answer on a two-slot server alone, then beside a neighbour request in flight.

    ``cfg`` names the target, prompt, tokens and engine settings (its drafter is
    ignored); ``other`` is the neighbour's prompt.  Returns my tokens alone and
    beside (and alone once more with ``repeat_alone``), the neighbour's tokens
    while mine ran, whether it was in flight from before my request to after it,
    the slots, and the server's command line.
    """
    cancel = cancel or (lambda: False)
    cfg = replace(cfg, spec_type="none", draft=None, serial_verify=False)
    plan = runner.plan(cfg)
    slot_ctx = max(plan.n_ctx, SLOT_CTX)
    argv = two_slot_argv(plan.vanilla_argv, plan.info, slot_ctx)
    if ubatch is not None:
        argv = with_ubatch(argv, ubatch)
    srv, _ = runner.pool.get(plan.binary, argv, target=plan.target, label=f"neighbours{'-ub1' if ubatch else ''}",
                             cancel=cancel)
    api = endpoint(srv)
    n = cfg.max_tokens
    alone = _answer(api, plan.tokens, n, cfg.ignore_eos, cancel)
    neighbour = Neighbour(api, other, slot_ctx - len(other) - 8, cfg.ignore_eos)
    neighbour.start()
    try:
        t0 = time.monotonic()
        beside = _answer(api, plan.tokens, n, cfg.ignore_eos, cancel)
        t1 = time.monotonic()
        during = neighbour.during(t0, t1)
        still = not neighbour.finished and neighbour.error is None
    finally:
        neighbour.stop()
        wait_idle(srv)
    out: dict[str, Any] = {
        "alone": alone["tokens"], "beside": beside["tokens"], "neighbour_tokens_during": during,
        "neighbour_in_flight": bool(neighbour.times) and neighbour.times[0] < t0 and still,
        "slots": [alone["slot"], beside["slot"]], "ubatch": ubatch or cfg.engine.n_ubatch,
        "args": srv.command()[1:], "neighbour_error": None if neighbour.error is None else str(neighbour.error),
    }
    if repeat_alone:
        out["alone_again"] = _answer(api, plan.tokens, n, cfg.ignore_eos, cancel)["tokens"]
    return out
