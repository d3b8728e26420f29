"""The house rules of the import graph, checked by running them.

pyproject.toml declares the contracts (core imports no backend, GUI or command
module; only specview.gui imports Qt; backends import no GUI or command module;
no cycle between sibling modules).  A contract that is never run protects
nothing, so the suite runs import-linter itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: import-linter's ``lint-imports`` command, run by the Python running the tests (found by its entry point, so
#: ``.venv/bin/python -m pytest`` works without the venv on PATH)
LINT_IMPORTS = ("import sys\n"
                "from importlib.metadata import entry_points\n"
                "(command,) = entry_points(group='console_scripts', name='lint-imports')\n"
                "sys.argv[0] = 'lint-imports'\n"
                "sys.exit(command.load()())\n")


def test_import_contracts_hold() -> None:
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail(f"import-linter is not installed in {sys.executable}: `pip install -e '.[dev]'` brings it")
    res = subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"import contracts broken:\n{res.stdout}\n{res.stderr}"
    assert "0 broken" in res.stdout


def test_the_core_imports_without_qt() -> None:
    """The Qt-free core (session, diagnosis, matrix) imports with PySide6 and pyqtgraph made unimportable."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6'):\n"
        "            raise ImportError(f'{name} is hidden for this check')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Block())\n"
        "import specview.core.session, specview.core.diagnose, specview.core.matrix, specview.core.report\n"
        "import specview.cli\n"
        "assert not any(m.split('.')[0] in ('PySide6', 'pyqtgraph') for m in sys.modules)\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
