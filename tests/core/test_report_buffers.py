"""The report's "weights held in" row: the buffers llama.cpp put each model's weights in, from the trace, in words;
whatever a file holds there is shown bounded, never a crash."""

from __future__ import annotations

import pytest

from specview.core.report.facts import buffers_text, model_facts


class _Trace:
    def __init__(self, target, draft=None):
        self.models = {"target": target, "draft": draft}


def _row(trace):
    return next((r for r in model_facts(trace) if r[0] == "weights held in"), None)


def test_the_row_names_each_buffer_with_its_size():
    t = _Trace({"file": "t.gguf", "weight_buffers": {"CPU_Mapped": 85.3, "CPU_REPACK": 56.95}},
               {"file": "d.gguf", "weight_buffers": {"CPU_Mapped": 136.4}})
    assert _row(t) == ("weights held in", "CPU_Mapped 85.3 MiB, CPU_REPACK 57.0 MiB", "CPU_Mapped 136.4 MiB")


def test_a_trace_without_the_record_has_no_row():
    assert _row(_Trace({"file": "t.gguf"})) is None
    assert _row(_Trace({"file": "t.gguf", "weight_buffers": {}})) is None


@pytest.mark.parametrize("value,shown", [
    ({"CPU": "lots"}, "CPU n/a"),
    ({"CPU": True}, "CPU n/a"),
    ([1, 2], "[1, 2]"),
    ("CPU_REPACK", "CPU_REPACK"),
    ({f"B{i}": i for i in range(20)}, ", ".join(f"B{i} {i:.1f} MiB" for i in range(8)) + ", …"),
])
def test_what_a_file_holds_there_is_shown_bounded(value, shown):
    row = _row(_Trace({"file": "t.gguf", "weight_buffers": value}))
    assert row is not None and row[1] == shown and row[2] == "-"
    assert buffers_text(value) == shown or not isinstance(value, dict)


def _config_rows(no_repack, models):
    from types import SimpleNamespace

    from specview.core.config import EngineSettings, RunConfig
    from specview.core.report.facts import config_facts

    cfg = RunConfig(prompt="x", engine=EngineSettings(no_repack=no_repack)).to_dict()
    return dict(config_facts(SimpleNamespace(config=cfg, environment={}, models=models)))


def test_repacking_on_says_which_weights_were_repacked_or_that_none_were():
    repacked = {"target": {"weight_buffers": {"CPU_Mapped": 98.87, "CPU_REPACK": 7.59}},
                "draft": {"weight_buffers": {"CPU_Mapped": 85.3, "CPU_REPACK": 56.95}}}
    assert _config_rows(False, repacked)["weight repack"] == \
        "on (llama.cpp's default): target 7.6 MiB, draft 57.0 MiB in CPU_REPACK"
    hosted = {"target": {"weight_buffers": {"Vulkan0": 130.1, "CPU_Mapped": 6.3}}, "draft": None}
    assert _config_rows(False, hosted)["weight repack"] == "on (llama.cpp's default), but no weights were repacked"
    # a trace from before the record, or a model that recorded none, says only what was asked
    assert _config_rows(False, {"target": {"file": "t.gguf"}})["weight repack"] == "on (llama.cpp's default)"
    assert _config_rows(False, None)["weight repack"] == "on (llama.cpp's default)"
    # off says why, whatever the models hold
    assert _config_rows(True, repacked)["weight repack"] == "off (--no-repack, as asked)"
    amx = {"target": {"weight_buffers": {"AMX": "x", "CPU_REPACK": 1.0}}}
    assert _config_rows(False, amx)["weight repack"] == \
        "on (llama.cpp's default): target 1.0 MiB in CPU_REPACK; target n/a in AMX"
