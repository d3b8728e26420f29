"""The suite's lanes (``tests/lanes.py``): a test that kills its lane is one failed test and the run
still ends, and the costliest files are handed out first.

Each check runs a small suite as its own pytest under the project's options (``[tool.pytest.ini_options]``'s
addopts and timeout, and the plugins ``tests/conftest.py`` registers), in two lanes.

The crash: seven files, two with a test that kills its lane by SIGSEGV, one mid-file and one last in
its file, so that files are still queued when each lane dies.  The run must end within a bound,
report each crash as a failed test named by its node id, run every other test once (the one after the
crash in its file too) and exit 1.  Under ``--dist loadfile`` with pytest-xdist's own scheduler this
run never ends (``tests/lanes.py`` says why).

The order: files whose costs the suite's table gives, and files it does not (counted by their tests),
each recording when its first test starts; every lane must take its files costliest first, and the
two lanes must start on the two costliest, where xdist's own order (by test count) starts elsewhere.
"""

from __future__ import annotations

import ast
import json
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


def _ini() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def _project_options() -> tuple[str, str]:
    """The project's pytest addopts and timeout, and the plugins ``tests/conftest.py`` registers."""
    ini = _ini()
    options = f"addopts = {ini.get('addopts', '')!r}\n"
    if "timeout" in ini:
        options += f"timeout = {ini['timeout']!r}\n"
    plugins: list[str] = []
    for node in ast.parse((TESTS / "conftest.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in node.targets):
            plugins = list(ast.literal_eval(node.value))
    return options, f"pytest_plugins = {plugins!r}\n"


def _run_suite(tmp_path: Path, files: dict[str, str], extra_ini: str = "") -> tuple[Path, Path, str, int, float]:
    """Write ``files`` as a suite under the project's options and run it in two lanes: the suite's
    folder, its lane files' folder, the run's output, its exit status and its wall time."""
    suite = tmp_path / "suite"
    suite.mkdir()
    options, plugins = _project_options()
    (suite / "pyproject.toml").write_text("[tool.pytest.ini_options]\n" + options + extra_ini)
    (suite / "conftest.py").write_text(plugins)
    for name, text in files.items():
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
        pytest.fail(f"the suite in two lanes did not end within {BOUND:.0f} s:\n{out[-4000:]}")
    return suite, lanes, out, proc.returncode, time.monotonic() - t0


def test_a_lane_killed_by_sigsegv_is_a_failed_test_and_the_run_ends(tmp_path):
    suite, lanes, out, returncode, secs = _run_suite(tmp_path, FILES)
    where = f"\n--- the run ({secs:.1f} s, exit {returncode}):\n{out[-4000:]}"
    for nodeid in sorted(CRASHES):
        assert re.search(rf"worker 'gw\d+' crashed while running '{re.escape(nodeid)}'", out), nodeid + where
        assert f"FAILED {nodeid}" in out, nodeid + where
    # -v: one line per test outcome; each test ran once, the crashed ones failed and no other
    outcomes = re.findall(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED) (\S+)", out, re.M)
    assert sorted(n for o, n in outcomes if o == "PASSED") == sorted(PASSES), where
    assert sorted(n for o, n in outcomes if o != "PASSED") == sorted(CRASHES), where
    assert re.search(rf"^=+ {len(CRASHES)} failed, {len(PASSES)} passed in ", out, re.M), where
    assert returncode == 1, where
    # the files that no crash touched kept their module fixture to one lane
    for name in ("test_a", "test_b"):
        assert len((suite / f"setups-{name}").read_text().split()) == 1, name + where

    # each lane that died left its lane file naming the test it was running; the others removed theirs
    left = [p.read_text().split() for p in sorted(lanes.iterdir())] if lanes.is_dir() else []
    assert sorted(words[3] for words in left) == sorted(CRASHES), f"{left}{where}"
    assert all(words[0] == "running" for words in left), f"{left}{where}"


# the order: three files the table names (their test counts would put them elsewhere) and three it does
# not, one of them (300 tests at PER_TEST seconds) between two the table names
ORDER_FILES = {"test_heavy.py": 1, "test_mid.py": 2, "test_light.py": 4, "test_many.py": 300, "test_five.py": 5,
               "test_three.py": 3}
ORDER_COSTS = {"test_heavy.py": 300, "test_mid.py": 100, "test_light.py": 20}


@pytest.mark.parametrize("table", [True, False], ids=["with-costs", "without"])
def test_every_lane_takes_its_files_costliest_first(tmp_path, table):
    import lanes as plugin

    files = {name: "".join(PASSING.format(i=i) for i in range(n)) for name, n in ORDER_FILES.items()}
    extra = ""
    if table:
        files["costs.json"] = json.dumps({"about": "planted", "seconds": ORDER_COSTS})
        extra = f"{plugin.COSTS_INI} = 'costs.json'\n"
    # the order worked out here, independently: the table's seconds, else PER_TEST seconds a test
    cost = {name: ORDER_COSTS.get(name, plugin.PER_TEST * n) if table else plugin.PER_TEST * n
            for name, n in ORDER_FILES.items()}
    expected = sorted(ORDER_FILES, key=lambda name: -cost[name])
    assert len(set(cost.values())) == len(cost)  # no ties: one right order

    _, _, out, returncode, secs = _run_suite(tmp_path, files, extra)
    where = f"\n--- the run ({secs:.1f} s, exit {returncode}):\n{out[-4000:]}"
    assert returncode == 0, where
    runs: dict[str, list[str]] = {}  # lane: its files, in the order it ran them
    for lane, name in re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+?)::", out, re.M):
        if name not in runs.setdefault(lane, []):
            runs[lane].append(name)
    assert sorted(n for names in runs.values() for n in names) == sorted(ORDER_FILES), where
    assert len(runs) == 2, where
    for lane, names in runs.items():
        assert names == [n for n in expected if n in names], f"{lane} ran {names}, not costliest first{where}"
    assert {names[0] for names in runs.values()} == set(expected[:2]), where
    # the layout means what it says: with the table a one-test file starts, without it the 300-test one
    assert expected[0] == ("test_heavy.py" if table else "test_many.py")


def test_a_broken_cost_table_is_refused_naming_it(tmp_path):
    files = {"test_a.py": PASSING.format(i=0), "costs.json": "[1, 2]"}
    _, _, out, returncode, _ = _run_suite(tmp_path, files, "lane_costs = 'costs.json'\n")
    assert returncode == 4, out[-3000:]  # pytest's usage error
    assert "created:" not in out, f"refused before any lane starts (stopping them cost seconds): {out[-3000:]}"
    assert "costs.json (the lane_costs ini option) is not a table of seconds per test file" in out, out[-3000:]
    assert "scripts/lane-costs.py" in out, out[-3000:]


def test_the_project_cost_table_names_files_that_exist():
    import lanes as plugin

    table = _ini().get(plugin.COSTS_INI)
    assert table, "pyproject.toml names no lane_costs table"
    seconds = json.loads((ROOT / table).read_text())["seconds"]
    missing = sorted(f for f in seconds if not (ROOT / f).is_file())
    assert not missing, f"{table} names test files that are gone: {missing}; write it again with scripts/lane-costs.py"
    assert all(isinstance(s, (int, float)) and s >= 0 for s in seconds.values())


def test_the_suite_runs_with_the_lanes_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("lanes")
