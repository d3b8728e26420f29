"""The llama-servers a runner keeps: one per command line, reused across runs, one target at a time.

A server is identified by its command line without ``-c``: two runs whose
flags differ only in context size share a server whose context is large
enough (a larger KV cache does not change what a pass computes; the
in-process engine reuses its contexts the same way).  Servers of another
target are stopped before a new target's server starts, so at most one
target's weights are loaded at a time; :attr:`ServerPool.limit` bounds how
many servers of that target stay up (least recently used goes first).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..local_server.process import CancelFn, ProgressFn, start_all
from .process import LlamaServer


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a == flag:
            return argv[i + 1]
    return None


def argv_key(argv: Sequence[str]) -> tuple[str, ...]:
    """A command line without its ``-c`` value (the part that decides what a pass computes)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "-c":
            skip = True
            continue
        out.append(a)
    return tuple(out)


def with_ubatch(argv: Sequence[str], ub: int) -> list[str]:
    """The command line with ``-ub`` set to ``ub`` (1 for a serial verify: every pass one token)."""
    out = list(argv)
    if "-ub" in out:
        out[out.index("-ub") + 1] = str(ub)
    else:
        out += ["-ub", str(ub)]
    return out


class ServerPool:
    """Live llama-servers by command line; counts every start in :attr:`starts`."""

    def __init__(self, *, progress: ProgressFn | None = None, limit: int = 3):
        self.progress = progress or (lambda msg: None)
        self.limit = limit
        self.starts = 0
        self._servers: dict[tuple, LlamaServer] = {}  # key -> server, in least-recently-used order
        self._target: str | None = None

    def get(self, binary: str, argv: Sequence[str], *, target: str, label: str, cancel: CancelFn | None = None,
            timeout: float | None = None) -> tuple[LlamaServer, bool]:
        """A ready server for ``argv`` (its ``-c`` at least the one asked for); (server, started now)."""
        (srv, started), = self.ensure(binary, [(argv, label)], target=target, cancel=cancel, timeout=timeout)
        return srv, started

    def ensure(self, binary: str, wanted: Sequence[tuple[Sequence[str], str]], *, target: str,
               cancel: CancelFn | None = None, timeout: float | None = None) -> list[tuple[LlamaServer, bool]]:
        """Ready servers for each (argv, label); the missing ones start together (they load in parallel)."""
        out: list[tuple[LlamaServer, bool] | None] = []
        new: list[tuple[int, tuple, LlamaServer]] = []
        if self._target is not None and self._target != target:
            self.stop_all()  # one target's weights in memory at a time
        for argv, label in wanted:
            key = (binary, argv_key(argv))
            need_ctx = int(_flag_value(argv, "-c") or 0)
            srv = self._servers.pop(key, None)
            if srv is not None:
                if srv.alive() and int(_flag_value(srv.args, "-c") or 0) >= need_ctx:
                    self._servers[key] = srv
                    out.append((srv, False))
                    continue
                srv.stop()
            out.append(None)
            new.append((len(out) - 1, key, LlamaServer(binary, list(argv), label=label, progress=self.progress)))
        if new:
            keep = {k for k in (x[1] for x in new)} | {(binary, argv_key(a)) for a, _ in wanted}
            while len(self._servers) + len(new) > self.limit and any(k not in keep for k in self._servers):
                oldest = next(k for k in self._servers if k not in keep)
                self._servers.pop(oldest).stop()
            kw: dict[str, Any] = {"cancel": cancel}
            if timeout is not None:
                kw["timeout"] = timeout
            start_all([s for _, _, s in new], **kw)
            self.starts += len(new)
            for i, key, srv in new:
                self._servers[key] = srv
                out[i] = (srv, True)
            self._target = target
        return out  # type: ignore[return-value]

    def find(self, binary: str, argv: Sequence[str]) -> LlamaServer | None:
        """The live server for ``argv``, if there is one (no start)."""
        srv = self._servers.get((binary, argv_key(argv)))
        return srv if srv is not None and srv.alive() else None

    def drop_dead(self) -> None:
        for k in [k for k, s in self._servers.items() if not s.alive()]:
            self._servers.pop(k).stop()

    def live(self) -> list[LlamaServer]:
        return [s for s in self._servers.values() if s.alive()]

    def stop_all(self) -> None:
        for s in self._servers.values():
            s.stop()
        self._servers.clear()
        self._target = None

    def describe(self) -> Mapping[str, Any]:
        return {"servers": len(self._servers), "target": self._target, "starts": self.starts}
