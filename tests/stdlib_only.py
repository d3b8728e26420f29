"""What a sample of model-written code may import: the standard library alone, as ``python -I -S`` gives it.

Shared by ``tests/quality/test_sample_python.py`` (a stand-in frozen app) and ``tests/bundle/test_bundle.py``
(the real bundle).
"""

from __future__ import annotations

import sys
from pathlib import Path

from specview.core.quality.execute import Limits

ROOT = Path(__file__).resolve().parents[1]
LIMITS = Limits(wall_s=5, cpu_s=3, memory_mb=256)

#: what a sample can import: the standard library, and none of what the app carries
IMPORTS = """\
import sys
for name in ("json", "sqlite3", "numpy", "specview", "PySide6", "llama_cpp"):
    try:
        __import__(name)
        print(name, "imported")
    except ImportError as e:
        print(name, type(e).__name__, e)
print("outside the standard library:", sorted(n for n in sys.modules if n.partition(".")[0] not in
                                               sys.stdlib_module_names and n != "__main__"))
print("argv", sys.argv, "main", __name__)
"""
EXPECTED = """\
json imported
sqlite3 imported
numpy ModuleNotFoundError No module named 'numpy'
specview ModuleNotFoundError No module named 'specview'
PySide6 ModuleNotFoundError No module named 'PySide6'
llama_cpp ModuleNotFoundError No module named 'llama_cpp'
outside the standard library: []
argv ['sample.py'] main __main__
"""


def frozen_stand_in(folder: Path) -> str:
    """An executable that is the app, as the bundle's ``specview`` is: the bundle's entry point on this Python,
    importing the specview these tests import (the sandbox gives its interpreter no PYTHONPATH of ours)."""
    import specview

    exe = folder / "specview"
    src = Path(specview.__file__).resolve().parents[1]
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{src}" exec "{sys.executable}" "{ROOT / "packaging" / "launcher.py"}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)
