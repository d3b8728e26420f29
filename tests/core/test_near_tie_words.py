"""Why a proven near-tie is no bug, said in the words of the target's own weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specview.core.diagnose.words import explain
from specview.core.trace import Trace

REAL = Path(__file__).parents[1] / "hostile" / "data" / "real-trace.json"


def _proven(quant: str) -> str:
    doc = json.loads(REAL.read_text(encoding="utf-8"))
    doc["models"]["target"]["quantization"] = quant
    trace = Trace.from_json(doc)
    assert trace.diagnosis["rule"] == "serial-verify-reproduces-vanilla"  # a near-tie the control proved
    return explain(trace.diagnosis, trace)


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0", "q4_0", ""])
def test_a_quantized_or_unknown_target_is_called_quantized(quant):
    words = _proven(quant)
    assert "This is expected on quantized targets and is not a bug in the speculative loop." in words
    assert "Float weights" not in words


@pytest.mark.parametrize("quant", ["BF16", "F16", "f32"])
def test_a_float_target_is_not_called_quantized(quant):
    words = _proven(quant)
    assert "quantized targets" not in words
    assert f"Float weights ({quant.upper()}) round by batch shape too" in words
    assert "This is not a bug in the speculative loop." in words
