"""What the parent and the worker both know besides the pipe: how a worker is named, and its activity file.

Both sides import it (and :mod:`.wire`, the messages), never each other's
module.  It imports nothing heavy: ``specview.cli`` reads :data:`WORKER_ARG`
on every start.
"""

from __future__ import annotations

import mmap
import struct

#: the frozen app's first argument that makes it an engine worker (``specview.cli`` looks for it)
WORKER_ARG = "--specview-engine-worker"
#: what a worker runs when specview is not frozen: ``python -m CHILD_MODULE FD SETUP``
CHILD_MODULE = "specview.core.worker.child"

ACTIVITY_SIZE = 4096
_HEADER = struct.Struct("<QI")  # counter, text length


class ActivityFile:
    """What the worker is doing: a counter and a line of text in a mapped file; the worker writes, the parent reads
    (:mod:`specview.core.activity` is the worker's sink, the parent's deadline watches the counter)."""

    def __init__(self, path: str, *, create: bool = False):
        if create:
            with open(path, "wb") as fh:
                fh.write(b"\0" * ACTIVITY_SIZE)
        self._fh = open(path, "r+b")
        self._map = mmap.mmap(self._fh.fileno(), ACTIVITY_SIZE)
        self.count = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")[: ACTIVITY_SIZE - _HEADER.size]
        self.count += 1
        self._map[_HEADER.size:_HEADER.size + len(data)] = data
        self._map[:_HEADER.size] = _HEADER.pack(self.count, len(data))

    def read(self) -> tuple[int, str]:
        count, n = _HEADER.unpack(self._map[:_HEADER.size])
        n = min(n, ACTIVITY_SIZE - _HEADER.size)
        return count, self._map[_HEADER.size:_HEADER.size + n].decode("utf-8", "replace")

    def close(self) -> None:
        try:
            self._map.close()
            self._fh.close()
        except (OSError, ValueError):
            pass
