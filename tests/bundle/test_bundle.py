"""Smoke tests of the built desktop bundle (``scripts/build-bundle.sh``), not of the source tree.

They run the frozen ``dist/specview/specview`` as a user would: the CLI on the
demo model, the app offscreen through ``--smoke``, and the Linux desktop files
through the freedesktop validators.  Without a bundle they skip and say how to
build one; CI builds it and sets ``SPECVIEW_REQUIRE_BUNDLE=1``, which turns a
missing bundle or validator into a failure.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from require import missing, required

from specview.core.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = required("SPECVIEW_REQUIRE_BUNDLE")


def _missing(what: str) -> None:
    missing(what, switch="SPECVIEW_REQUIRE_BUNDLE")


@pytest.fixture(scope="module")
def bundle() -> Path:
    folder = Path(os.environ.get("SPECVIEW_BUNDLE") or ROOT / "dist" / "specview")
    exe = folder / "specview"
    if not exe.is_file():
        _missing(f"no bundle at {folder}: build it with `bash scripts/build-bundle.sh`")
    return exe


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the bundle must run on what it carries, not on the source tree
    env["QT_QPA_PLATFORM"] = "offscreen"
    env.setdefault("SPECVIEW_CONFIG_DIR", str(tmp_path / "config"))
    return env


@pytest.mark.slow
def test_the_bundled_cli_runs_the_demo_and_prints_a_verdict(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    res = subprocess.run([str(bundle), "run", "-n", "32", "-q", "--json", str(out)], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode in (0, 1), res.stderr
    assert "VERDICT" in res.stdout
    trace = Trace.load(out)
    # the verdict printed is the one the trace records, and the exit status agrees with the comparison
    assert trace.diagnosis is not None
    assert f"VERDICT  {trace.diagnosis['verdict'].upper()}" in res.stdout
    assert res.returncode == (0 if trace.comparison.identical else 1)
    assert len(trace.vanilla.tokens) == 32


@pytest.mark.slow
def test_the_bundled_app_opens_offscreen_runs_the_demo_and_writes_a_trace(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    res = subprocess.run([str(bundle), "gui", "--smoke", str(out), "-n", "16"],
                         env={**_env(tmp_path), "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    trace = Trace.load(out)
    assert len(trace.vanilla.tokens) == 16 and len(trace.speculative.tokens) == 16
    assert trace.config["max_tokens"] == 16
    # the throwaway settings folder and the engine worker's folder go with the run
    left = sorted(p.name for p in scratch.glob("specview-*"))
    assert left == [], f"the smoke run left {left} in $TMPDIR"


def test_the_bundled_app_is_the_sandboxs_python(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the bundle the sandbox starts the app itself as a sample's interpreter; the sample sees the standard
    library alone, as under ``python -I -S`` from a pip install, though numpy, Qt and specview are in the bundle."""
    from stdlib_only import EXPECTED, IMPORTS, LIMITS

    from specview.core.quality.execute import run_sample

    plain = run_sample(IMPORTS, limits=LIMITS)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(bundle))
    res = run_sample(IMPORTS, limits=LIMITS)
    assert res.passed, res
    # the bundle's own loaders (PyInstaller's pyimod* modules) stay: their finders import with them
    loaders = re.search(r"^outside the standard library: (\[.*\])$", res.output, re.M)
    assert loaders and all(n.startswith("pyimod") for n in ast.literal_eval(loaders.group(1))), res.output
    assert res.output.replace(loaders.group(1), "[]") == plain.output == EXPECTED
    assert res.fences is not None and plain.fences is not None
    assert res.fences.lines(LIMITS) == plain.fences.lines(LIMITS) and res.fences.missing() == plain.fences.missing()


#: one code item the demo can answer: its completion runs in the sandbox, in the bundle as from the source tree
CODE_SUITE = {"id": "add", "prompt": 'def add(a, b):\n    """Return the sum of a and b."""\n',
              "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
              "entry_point": "add"}


@pytest.mark.slow
def test_the_bundled_cli_runs_model_written_code_as_the_source_tree_does(bundle: Path, tmp_path: Path) -> None:
    from specview.core.quality import RESULT_FILE, QualityResult

    suite = tmp_path / "code.jsonl"
    suite.write_text(json.dumps(CODE_SUITE) + "\n")
    args = ["quality", "--suite", str(suite), "--execute", "--max-tokens", "48", "-q"]
    runs = {}
    for name, cmd in (("bundle", [str(bundle)]), ("source", [sys.executable, "-m", "specview"])):
        out = tmp_path / name
        res = subprocess.run([*cmd, *args, "-o", str(out)], env=_env(tmp_path), capture_output=True, text=True,
                             timeout=600)
        assert res.returncode in (0, 1), res.stdout + res.stderr
        runs[name] = QualityResult.load(out / RESULT_FILE)
    bundled, source = runs["bundle"], runs["source"]
    assert bundled.sandbox["enforced"] and bundled.sandbox["missing"] == source.sandbox["missing"]
    assert bundled.sandbox["enforced"] == source.sandbox["enforced"]
    (b,), (s,) = bundled.items, source.items
    assert b.error is None and s.error is None
    for arm in ("vanilla", "speculative"):
        got, want = getattr(b, arm), getattr(s, arm)
        # the same completion, judged the same, for the same reason (never a sandbox that did not start)
        assert (got.passed, got.why) == (want.passed, want.why), (arm, got, want)
        assert "sandbox" not in (got.why or "") and "launcher" not in (got.why or "")


@pytest.mark.parametrize("tool,args,name", [
    ("desktop-file-validate", [], "io.github.specview.specview.desktop"),
    ("appstreamcli", ["validate", "--no-net"], "io.github.specview.specview.metainfo.xml"),
])
def test_the_desktop_files_validate(tool: str, args: list[str], name: str) -> None:
    exe = shutil.which(tool)
    if exe is None:
        _missing(f"{tool} is not installed (Debian: desktop-file-utils, appstream)")
    res = subprocess.run([exe, *args, str(ROOT / "packaging" / name)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
