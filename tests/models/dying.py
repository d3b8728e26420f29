"""A header read that kills the process reading it (imported by a scan's spawned readers, by name).

:func:`read_or_die` stands in for :func:`specview.core.models.reads.read_one`: in a spawned reader it ends
that process outright (as a native crash or the OOM killer would) on a file whose name holds ``die``; in the
scan's own process, and on every other file, it is the real read.  A pool of readers then breaks mid-scan,
and what the scan does about it is what the tests see."""

from __future__ import annotations

import multiprocessing
import os

from specview.core.models import reads

_real = reads.read_one  # taken before a test puts read_or_die in its place


def read_or_die(path, name, source):
    if multiprocessing.parent_process() is not None and "die" in os.path.basename(path):
        os._exit(9)
    return _real(path, name, source)
