"""Reading a file the user names (a prompt, a trace, a matrix spec, a suite): whole, with a bound, never stalled.

A named file is read into memory whole, so what it is gets checked before a byte is read: a device
(``/dev/zero`` read whole fills the machine's memory), a socket or a folder is refused, and so is a FIFO
(its ``open()`` waits for a writer for ever, a frozen window in the app) unless the caller reads from the
command line, where a pipe the user's own shell feeds (``specview run -f <(...)``) is the point.  What is read
stops one byte past a limit larger than any file of the kind ever is, and a GGUF model given where text goes
(``-f model.gguf`` for ``-m model.gguf``) is named as one, not decoded as text.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import SpecviewError

#: the first bytes of every GGUF file
GGUF_MAGIC = b"GGUF"


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is, in words, when it is neither a regular file nor a folder (else None)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "not a regular file"


def megabytes(n: int) -> str:
    """``n`` bytes as whole megabytes (MiB), for a limit's message (bytes below one)."""
    return f"{n / (1 << 20):,.0f} MB" if n >= 1 << 20 else f"{n:,} bytes"


def read_user_file(path: str | os.PathLike[str], *, what: str, limit: int, error: type[SpecviewError] = SpecviewError,
                   pipes: bool = False) -> bytes:
    """The bytes of the file at ``path``, which ``what`` names in a message ("a prompt file", "a JSON file").

    ``error`` names the file and what to do when it is missing, a folder, a device or socket, a FIFO (unless
    ``pipes``: a command line's ``<(...)`` is one), a GGUF model, unreadable, or larger than ``limit`` bytes."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except OSError as exc:
        raise error(f"{p}: cannot read it ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise error(f"{p}: is a folder, not {what}")
    kind = kind_of(mode)
    if kind and not (pipes and stat.S_ISFIFO(mode)):
        raise error(f"{p}: {kind}, not {what}; give a regular file")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{p}: cannot read it ({exc.strerror or exc})") from None
    if raw.startswith(GGUF_MAGIC):
        raise error(f"{p}: a GGUF model file, not {what}")
    if len(raw) > limit:
        raise error(f"{p}: more than {megabytes(limit)}; no {what.split(' ', 1)[-1]} specview reads is that large")
    return raw
