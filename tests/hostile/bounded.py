"""Run a hostile-input property in a child interpreter with its time and memory bounded.

A reader that loops for minutes, blocks on a FIFO or allocates gigabytes on one crafted input must fail its
test, naming the input, never stall or starve the suite.  :func:`run` starts ``python`` on this file with
a property's ``module:function``; the child caps its address space (``RLIMIT_AS``) and CPU time
(``RLIMIT_CPU``), and :func:`deadline` turns one input's call that runs past its seconds into
:class:`Overran` (SIGALRM interrupts a blocked ``open()`` too), so hypothesis reports and shrinks that
input like any other failure.  The parent waits for the child with a wall-clock bound of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
#: a child's address space: far above what any reader needs, far below what a runaway allocation takes
MEMORY_MB = 2048
#: seconds one input may take, and the whole child
INPUT_SECONDS = 10
CHILD_SECONDS = 300


class Overran(Exception):
    """One input took longer than its deadline: a reader that can be stalled."""


@contextlib.contextmanager
def deadline(seconds: float = INPUT_SECONDS, what: str = "the reader") -> Iterator[None]:
    """Raise :class:`Overran` in the block when it runs past ``seconds`` (main thread only)."""

    def fire(signum, frame):
        raise Overran(f"{what} ran past {seconds} s on this input")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(target: str, *, timeout: float = CHILD_SECONDS, memory_mb: int = MEMORY_MB) -> None:
    """Run ``module:function`` (a module of tests/hostile) in a bounded child; AssertionError with its output
    unless it passed."""
    # this checkout's specview first: the child runs in a scratch folder, where an installed copy would win
    path = [str(TESTS.parent), str(HERE), str(TESTS), str(TESTS / "models"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path),
               SPECVIEW_HOSTILE_MEMORY_MB=str(memory_mb), QT_QPA_PLATFORM="offscreen")
    import tempfile

    try:
        # hypothesis keeps its files in the child's cwd, and every temporary file the child makes goes under
        # it too (TMPDIR), so all of it goes when the child does
        with tempfile.TemporaryDirectory(prefix="specview-hostile-") as cwd:
            res = subprocess.run([sys.executable, str(Path(__file__)), target], env=dict(env, TMPDIR=cwd),
                                 capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{target}: the bounded child ran past {timeout} s\n{exc.stderr or ''}") from None
    assert res.returncode == 0, f"{target} failed (exit status {res.returncode}):\n{res.stdout}\n{res.stderr}"
    assert "PASSED" in res.stdout, res.stdout + res.stderr


def _child(target: str) -> int:
    import importlib
    import resource

    mb = int(os.environ.get("SPECVIEW_HOSTILE_MEMORY_MB", MEMORY_MB))
    resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (CHILD_SECONDS, CHILD_SECONDS))
    module, func = target.split(":")
    import specview

    assert Path(specview.__file__).resolve().is_relative_to(TESTS.parent), f"not this checkout's: {specview.__file__}"
    getattr(importlib.import_module(module), func)()
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
