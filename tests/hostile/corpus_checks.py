"""Two readers that misbehave on purpose, for ``test_the_bounds_hold``: the corpus's bounds catch both."""

from __future__ import annotations

import os
import tempfile

from bounded import deadline


def allocate() -> None:
    blob = bytearray(8 << 30)  # 8 GB: past the child's address space
    print(len(blob))


def hang() -> None:
    fifo = os.path.join(tempfile.mkdtemp(), "x.gguf")
    os.mkfifo(fifo)
    with deadline(1):
        open(fifo, "rb")  # blocks until a writer opens it: none ever does
