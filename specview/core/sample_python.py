"""The frozen app as the sandbox's ``python -I -S -c``.

A sample of model-written code runs in a fresh interpreter started as ``python -I -S -c BOOT ARG...``
(:mod:`specview.core.quality.execute`). The desktop bundle (PyInstaller) has no ``python`` to start: its
executable is the app. There the sandbox starts the app itself with :data:`SAMPLE_ARG` first, and
:func:`specview.cli.main` hands the rest of the command line to :func:`run` before it imports anything
else, as it hands :data:`~specview.core.worker.shared.WORKER_ARG` to the engine worker.

What ``-I -S`` gives a sample elsewhere it gets here too: the standard library and nothing else. The
bundle carries numpy, Qt and specview itself, where ``python -S`` sees no site-packages; so every module
the app imported before this point is forgotten, and a finder placed first refuses any import outside
``sys.stdlib_module_names``, with the error ``python -S`` gives. A task that imports numpy then fails in
the app as it fails from a pip install, and the two give the same pass rates.

Not in ``quality/``: that package's ``__init__`` imports numpy, and this runs before anything heavy.
Standard library only.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Sequence

#: the first argument that makes the frozen app the sample's interpreter (``python -I -S -c`` elsewhere)
SAMPLE_ARG = "--specview-sample-python"


def _standard(name: str) -> bool:
    return name.partition(".")[0] in sys.stdlib_module_names


class StandardLibraryOnly:
    """A meta path finder, first in line: a module outside the standard library is not found."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if _standard(name):
            return None  # the finders after this one find it
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def forget_the_app() -> None:
    """Drop every module outside the standard library that this process imported before the sample (the app's
    own; PyInstaller's ``pyimod*`` loaders stay, as the bundle's importer runs on them), and refuse such imports
    from now on."""
    for name in [n for n in sys.modules if not _standard(n) and not n.startswith("pyimod") and n != "__main__"]:
        del sys.modules[name]
    sys.meta_path.insert(0, StandardLibraryOnly)


def run(argv: Sequence[str]) -> None:
    """What ``python -I -S -c argv[0] argv[1:]`` does: ``sys.argv`` is ``["-c", *argv[1:]]`` and the code runs
    in a fresh ``__main__`` module, with the standard library alone importable."""
    if not argv:
        raise SystemExit(f"{SAMPLE_ARG} needs the code to run")
    code, args = argv[0], list(argv[1:])
    forget_the_app()
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv = ["-c", *args]
    exec(compile(code, "<string>", "exec"), main.__dict__)  # noqa: S102


__all__ = ["SAMPLE_ARG", "StandardLibraryOnly", "forget_the_app", "run"]
