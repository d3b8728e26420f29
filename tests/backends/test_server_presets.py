"""The two preset matrices run on the demo through a real llama-server, and their summaries say what the cells say.

``specview matrix --preset llama-cpp-dspark`` and ``--preset lfm2-draft``, run as
a user runs them (the CLI, short: 24 tokens).  Each part's finding is checked
against that part's cells, read independently from the matrix file: the
outcome word, the fork position and verdict it names, the drafted counts; and
the facts a sound llama-server guarantees whatever the machine: plain decoding
is deterministic, and a zero-draft cell drafts nothing and is identical.
Where each fork falls is the machine's business, so no fork is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specview.core.verdicts import cell_label

from test_server import find_binary

pytestmark = [pytest.mark.demo, pytest.mark.slow]

N_TOKENS = 24


def run_preset(name: str, tmp_path) -> tuple[int, dict, str]:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "SPECVIEW_LLAMA_SERVER": find_binary()}
    threads = [] if os.environ.get("SPECVIEW_THREADS") else ["-t", "1"]
    p = subprocess.run([sys.executable, "-m", "specview", "matrix", "--preset", name, "-n", str(N_TOKENS),
                        *threads, "-c", "512", "-o", str(out), "-q"],
                       capture_output=True, text=True, env=env, timeout=1200)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return p.returncode, json.loads(out.read_text()), p.stdout


def by_part(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in doc["cells"]:
        out.setdefault(c["params"]["part"], []).append(c)
    return out


def check_findings(doc: dict, stdout: str) -> dict[str, dict]:
    """Every finding against its own cells; returns the findings by part."""
    parts = by_part(doc)
    found = {f["part"]: f for f in doc["findings"]}
    assert [p["name"] for p in doc["spec"]["parts"]] == list(found)
    for name, f in found.items():
        cells = parts[name]
        assert sorted(f["cells"]) == sorted(c["index"] for c in cells)
        assert all(c["status"] == "ok" for c in cells), [c.get("error") for c in cells]
        forks = [c for c in cells if not c["identical"]]
        want = "identical" if not forks else ("forks" if len(forks) == len(cells) else "mixed")
        assert f["outcome"] == want, (name, f)
        text = f["text"]
        if forks:
            first = min(forks, key=lambda c: c["first_mismatch"])
            assert f"forks at token {first['first_mismatch']} ({cell_label(first)})" in text, text
            assert "identical over" not in text.split(".")[0] or f["role"] == "toggle", text
        else:
            assert "forks at token" not in text, text
        # the summary the user reads is the same sentences
        assert text in doc["summary"] and text in stdout
    return found


def test_the_llama_cpp_dspark_preset_on_the_demo(tmp_path):
    rc, doc, stdout = run_preset("llama-cpp-dspark", tmp_path)
    parts = by_part(doc)
    assert list(parts) == ["vanilla-twice", "ngram", "dspark", "dspark-fa-off", "bf16"]
    assert len(parts["bf16"]) == 3 and all(len(parts[p]) == 1 for p in ("vanilla-twice", "ngram", "dspark"))
    dspark = parts["dspark"][0]
    assert dspark["params"]["drafter"] == "draft-dspark:demo:dspark" and dspark["params"]["n_max"] == 7
    assert dspark["n_drafted"] > 0 and dspark["target_quant"] == "Q4_K_M"
    assert parts["dspark-fa-off"][0]["params"]["flash_attn"] == "off"
    assert {c["target_quant"] for c in parts["bf16"]} == {"BF16"}
    found = check_findings(doc, stdout)
    # plain decoding on one llama-server is deterministic: the vanilla-twice part is identical
    assert found["vanilla-twice"]["outcome"] == "identical"
    assert f"identical over {N_TOKENS} tokens" in found["vanilla-twice"]["text"]
    ngram = parts["ngram"][0]
    if found["ngram"]["outcome"] == "identical":
        words = "is sound" if ngram["n_accepted"] > 0 else "proves nothing"
        assert words in found["ngram"]["text"]
    assert rc == (1 if any(not c["identical"] for c in doc["cells"]) else 0)


def test_the_lfm2_preset_on_the_demo(tmp_path):
    rc, doc, stdout = run_preset("lfm2-draft", tmp_path)
    parts = by_part(doc)
    assert list(parts) == ["draft", "p-min-1", "n-max-1", "f16"]
    zero = parts["p-min-1"][0]
    assert zero["params"]["p_min"] == 1.0 and parts["n-max-1"][0]["params"]["n_max"] == 1
    found = check_findings(doc, stdout)
    # p_min 1 drafts nothing, so the speculative arm is plain decoding: identical, and the summary says so
    assert zero["n_drafted"] == 0 and zero["identical"]
    assert found["p-min-1"]["text"].startswith("The same with --spec-draft-p-min 1: nothing drafted and identical")
    subject = found["draft"]["outcome"]
    toggle = found["n-max-1"]
    if subject == "identical" and toggle["outcome"] == "identical":
        assert "as the subject is" in toggle["text"]
    elif subject == "forks" and toggle["outcome"] == "identical":
        assert "--spec-draft-n-max 1 removes the subject's fork" in toggle["text"]
    elif subject == "forks" and toggle["outcome"] == "forks":
        assert "does not remove the fork" in toggle["text"]
    conclusion = [line for line in doc["summary"] if line.startswith("Together:")]
    if subject == "identical":
        assert conclusion and "does not fork here" in conclusion[0]
    elif found["f16"]["outcome"] == "identical":
        assert conclusion and "drafting nothing restores the output" in conclusion[0] \
            and "full-precision weights stay identical" in conclusion[0]
    else:
        assert conclusion and "full-precision weights fork too" in conclusion[0]
    assert rc == (1 if any(not c["identical"] for c in doc["cells"]) else 0)
