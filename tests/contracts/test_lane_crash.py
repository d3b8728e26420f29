"""A test that kills its lane (a SIGSEGV in native code) is one failed test, and the run still ends.

A small suite, run as its own pytest under the project's options (``[tool.pytest.ini_options]``'s
addopts and timeout, and the plugins ``tests/conftest.py`` registers), in two lanes: seven files,
two with a test that kills its lane by SIGSEGV, one mid-file and one last in its file, so that
files are still queued when each lane dies.  The run must end within a bound, report each crash as
a failed test named by its node id, run every other test once (the one after the crash in its file
too) and exit 1.  Under ``--dist loadfile`` with pytest-xdist's own scheduler this run never ends
(``tests/lanes.py`` says why).
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
BOUND = 120.0  # seconds; the run takes a few

PASSING = "def test_{i}():\n    pass\n"
CRASH = (
    "def test_crash():\n"
    "    faulthandler.disable()  # no traceback dump: the lane just dies\n"
    "    os.kill(os.getpid(), signal.SIGSEGV)\n"
)
HEADER = "import faulthandler\nimport os\nimport signal\n\n"
SHARED = (
    "import os\n\nimport pytest\n\n\n"
    "@pytest.fixture(scope='module', autouse=True)\n"
    "def shared():  # set up once per file when the file stays in one lane\n"
    "    with open(os.path.join(os.path.dirname(__file__), 'setups-' + __name__), 'a') as f:\n"
    "        f.write(str(os.getpid()) + '\\n')\n\n\n"
)

FILES = {
    "test_a.py": SHARED + "".join(PASSING.format(i=i) for i in range(4)),
    "test_b.py": SHARED + "".join(PASSING.format(i=i) for i in range(4)),
    "test_c_crash.py": HEADER + PASSING.format(i="before") + CRASH + PASSING.format(i="after"),
    "test_d.py": "".join(PASSING.format(i=i) for i in range(2)),
    "test_e_crash.py": HEADER + PASSING.format(i="before") + CRASH,
    "test_f.py": "".join(PASSING.format(i=i) for i in range(2)),
    "test_g.py": PASSING.format(i=0),
}
CRASHES = {"test_c_crash.py::test_crash", "test_e_crash.py::test_crash"}
PASSES = {
    f"{name}::{m}"
    for name, text in FILES.items()
    for m in re.findall(r"^def (test_\w+)", text, re.M)
} - CRASHES


def _project_options() -> tuple[str, str]:
    """The project's pytest addopts and timeout, and the plugins ``tests/conftest.py`` registers."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    options = f"addopts = {ini.get('addopts', '')!r}\n"
    if "timeout" in ini:
        options += f"timeout = {ini['timeout']!r}\n"
    plugins: list[str] = []
    for node in ast.parse((TESTS / "conftest.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in node.targets):
            plugins = list(ast.literal_eval(node.value))
    return options, f"pytest_plugins = {plugins!r}\n"


def test_a_lane_killed_by_sigsegv_is_a_failed_test_and_the_run_ends(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    options, plugins = _project_options()
    (suite / "pyproject.toml").write_text("[tool.pytest.ini_options]\n" + options)
    (suite / "conftest.py").write_text(plugins)
    for name, text in FILES.items():
        (suite / name).write_text(text)
    lanes = tmp_path / "lanes"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPECVIEW_"))}
    env.update(PYTHONPATH=str(TESTS), SPECVIEW_LANES_DIR=str(lanes), PYTHONDONTWRITEBYTECODE="1")

    # the plugins the scheduling and the options need, not every installed one (each lane would import
    # them all again: hypothesis alone takes seconds); two lanes whatever the machine's core count
    # (-n given here wins over addopts' -n auto)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "pytest_timeout", "-p", "no:cacheprovider",
           "-n", "2", "-v"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=suite, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and its lanes
        out, _ = proc.communicate()
        pytest.fail(f"the run with crashing lanes did not end within {BOUND:.0f} s:\n{out[-4000:]}")
    secs = time.monotonic() - t0

    where = f"\n--- the run ({secs:.1f} s, exit {proc.returncode}):\n{out[-4000:]}"
    for nodeid in sorted(CRASHES):
        assert re.search(rf"worker 'gw\d+' crashed while running '{re.escape(nodeid)}'", out), nodeid + where
        assert f"FAILED {nodeid}" in out, nodeid + where
    # -v: one line per test outcome; each test ran once, the crashed ones failed and no other
    outcomes = re.findall(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED) (\S+)", out, re.M)
    assert sorted(n for o, n in outcomes if o == "PASSED") == sorted(PASSES), where
    assert sorted(n for o, n in outcomes if o != "PASSED") == sorted(CRASHES), where
    assert re.search(rf"^=+ {len(CRASHES)} failed, {len(PASSES)} passed in ", out, re.M), where
    assert proc.returncode == 1, where
    # the files that no crash touched kept their module fixture to one lane
    for name in ("test_a", "test_b"):
        assert len((suite / f"setups-{name}").read_text().split()) == 1, name + where

    # each lane that died left its lane file naming the test it was running; the others removed theirs
    left = [p.read_text().split() for p in sorted(lanes.iterdir())] if lanes.is_dir() else []
    assert sorted(words[3] for words in left) == sorted(CRASHES), f"{left}{where}"
    assert all(words[0] == "running" for words in left), f"{left}{where}"


def test_the_suite_runs_with_the_lanes_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("lanes")
