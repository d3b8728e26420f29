"""The errors specview reports to a user.

Every one of them means "exit status 2, print the message": the message names
the file or value at fault and says what to do.  Anything else escaping is a
bug in specview.
"""

from __future__ import annotations


class SpecviewError(Exception):
    """Base of every error specview reports to a user (CLI exit status 2)."""


class ConfigError(SpecviewError):
    """A setting is out of range or inconsistent with another one.

    ``setting`` is the declared field name (``p_min``), so each front end can
    name it its own way: the CLI by its flag, the app by its control, a
    matrix file by its key.
    """

    def __init__(self, message: str, *, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class WriteError(SpecviewError, OSError):
    """A file specview writes could not be: a folder that takes no files (``/proc``, read-only, no permission), a
    full disk.  The message names the file and says nothing was changed; it is an OSError too, so a caller that
    treats a failed write as an OSError (a cache, the app's settings) still does."""


class ModelFileError(SpecviewError):
    """A model file is missing, unreadable, or not a model llama.cpp/MLX can load."""


class BackendUnavailable(SpecviewError):
    """The engine's library is not installed or cannot run on this platform."""


class IncompatibleVocab(SpecviewError):
    """A draft model's vocabulary cannot be used to draft for the target."""


class ContextOverflow(SpecviewError):
    """The prompt plus the tokens to generate do not fit in the context."""


class EvalError(SpecviewError):
    """A forward pass failed inside the backend."""


class Cancelled(SpecviewError):
    """The caller's cancel check returned True."""


class EngineCrashed(SpecviewError):
    """The engine's worker process died (a signal, an early exit) or stopped making progress.

    The message says what it was doing, the native function where the platform
    told, a known cause when one matches, and what to try.  ``trace`` is what
    the run had computed before the death (arms stopped with reason
    ``"crashed"``), or None when nothing was; ``crash`` is the same account as a
    JSON-ready dict (a trace keeps it under its ``crash`` key).
    """

    def __init__(self, message: str, *, crash: dict | None = None, trace: object | None = None):
        super().__init__(message)
        self.crash: dict = dict(crash or {})
        self.trace = trace

    @property
    def signal(self) -> str | None:
        """The signal's name ("SIGSEGV") when a signal ended the worker."""
        return self.crash.get("signal")

    @property
    def exitcode(self) -> int | None:
        return self.crash.get("exitcode")

    @property
    def activity(self) -> str | None:
        return self.crash.get("activity")

    @property
    def known_cause(self) -> dict | None:
        return self.crash.get("known_cause")

    def __reduce__(self):  # keyword-only arguments survive pickling
        return (_rebuild_crash, (str(self), self.crash, self.trace))


def _rebuild_crash(message: str, crash: dict, trace: object) -> "EngineCrashed":
    return EngineCrashed(message, crash=crash, trace=trace)
