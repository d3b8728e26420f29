"""The lfm2-draft preset on its own architecture: the tiny LFM2 (tests/tinyhybrid.py), not a stand-in.

``specview matrix --preset lfm2-draft`` with the record's three roles filled by tiny LFM2 files (a Q8_0
target, the F32 reference, a Q4_0 draft model), run as a user runs it, on the in-process engine (where the
target rolls back by checkpoint and replay) and on llama-server (required in CI with
``SPECVIEW_REQUIRE_SERVER=1``).  Each part's finding is checked against its own cells, as the demo's preset
test checks them; whether a cell forks is the machine's business, so no fork is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyhybrid import write_tiny_lfm2  # noqa: E402

from test_server import find_binary  # noqa: E402
from test_server_presets import by_part, check_findings  # noqa: E402

pytestmark = [pytest.mark.slow]

N_TOKENS = 24


@pytest.fixture(scope="module")
def roles(tmp_path_factory) -> dict[str, Path]:
    from specview.backends.llama_cpp.quantize import quantize

    d = tmp_path_factory.mktemp("lfm2-preset")
    ref = write_tiny_lfm2(d / "tiny-lfm2.F32.gguf", n_embd=128)
    return {"quantized": quantize(ref, d / "tiny-lfm2.Q8_0.gguf", "Q8_0", threads=1), "reference": ref,
            "draft": quantize(ref, d / "tiny-lfm2.Q4_0.gguf", "Q4_0", threads=1)}


def run_preset(roles: dict[str, Path], tmp_path: Path, *engine: str) -> tuple[int, dict, str]:
    out = tmp_path / "lfm2.json"
    threads = [] if os.environ.get("SPECVIEW_THREADS") else ["-t", "1"]
    models = [a for role, path in roles.items() for a in ("--model", f"{role}={path}")]
    p = subprocess.run([sys.executable, "-m", "specview", "matrix", "--preset", "lfm2-draft", *engine, *models,
                        "-n", str(N_TOKENS), *threads, "-c", "512", "-o", str(out), "-q"],
                       capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return p.returncode, json.loads(out.read_text()), p.stdout


def check(doc: dict, stdout: str, rc: int, roles: dict[str, Path]) -> dict[str, list[dict]]:
    parts = by_part(doc)
    assert list(parts) == ["draft", "p-min-1", "n-max-1", "f16"]
    found = check_findings(doc, stdout)
    zero = parts["p-min-1"][0]
    assert zero["n_drafted"] == 0 and zero["identical"]  # p_min 1 drafts nothing: plain decoding
    assert found["p-min-1"]["text"].startswith("The same with --spec-draft-p-min 1: nothing drafted and identical")
    subject = parts["draft"][0]
    assert 0 < subject["n_accepted"] < subject["n_drafted"], "the Q4_0 draft model must be accepted in part"
    assert Path(subject["params"]["target"]).name == roles["quantized"].name
    assert {Path(c["params"]["target"]).name for c in parts["f16"]} == {roles["reference"].name}
    assert rc == (1 if any(not c["identical"] for c in doc["cells"]) else 0)
    return parts


def test_the_lfm2_preset_on_the_tiny_lfm2_in_process(roles, tmp_path):
    rc, doc, stdout = run_preset(roles, tmp_path, "--engine", "llama.cpp")
    check(doc, stdout, rc, roles)
    assert doc["spec"]["backend"] == "llama.cpp"


def test_the_lfm2_preset_on_the_tiny_lfm2_through_llama_server(roles, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIEW_LLAMA_SERVER", find_binary())
    rc, doc, stdout = run_preset(roles, tmp_path)
    check(doc, stdout, rc, roles)
    assert doc["spec"]["backend"] == "llama-server"
