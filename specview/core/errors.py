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
