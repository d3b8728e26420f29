"""Opening what other programs wrote without being stalled by it: regular files only, read with a bound.

A store's folder can hold anything with a model's name: a FIFO (``open()``
of one waits for a writer forever), a socket, a device.  Every file discovery
reads goes through :func:`open_regular`: it opens with ``O_NONBLOCK`` (a
FIFO's open returns at once, a socket's fails) and keeps the descriptor only
when ``fstat`` says it is a regular file, so nothing that changes between a
check and the open can slip through.  :func:`read_small` reads such a file
whole up to a limit.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from typing import Iterator

from ..userfiles import kind_of

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a socket, a device): nothing of it is read.  ``what`` says what
    it is; ``strerror`` is the line a scan shows."""

    def __init__(self, path: str | os.PathLike[str], what: str):
        super().__init__(errno.EINVAL, not_regular_why(what), os.fspath(path))
        self.what = what


def not_regular_why(what: str) -> str:
    """The one line a scan says of a path that is ``what`` (:func:`kind_of`)."""
    return f"{what}, not a regular file: skipped unread"


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegular:
    return NotRegular(path, kind_of(mode) or "a folder")


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file at ``path`` (symlinks followed); :class:`NotRegular` for a
    FIFO, socket, device or folder, OSError when it cannot be opened.  Never blocks."""
    st = os.stat(path)  # refuse a device before opening it: opening one can have side effects
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket put in its place since the stat
            raise NotRegular(path, "a socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise _refuse(path, mode)
        if _FLAGS & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def opened(path: str | os.PathLike[str]) -> Iterator[int]:
    """:func:`open_regular` as a context (the descriptor is closed on the way out)."""
    fd = open_regular(path)
    try:
        yield fd
    finally:
        os.close(fd)


class TooLarge(ValueError):
    """A file larger than what it claims to be ever is (a manifest of a GB)."""


def read_small(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (:class:`TooLarge` past that)."""
    with opened(path) as fd:
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    if n > limit:
        raise TooLarge(f"{os.fspath(path)}: more than {limit} bytes")
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """:func:`read_small` decoded as UTF-8 (bad bytes replaced)."""
    return read_small(path, limit).decode("utf-8", "replace")
