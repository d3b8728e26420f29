"""The kernel map on toy engines whose batched numerics are planted: known dispatch widths, known noise."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fakes import DispatchToy, KernelToy, ToyModel
from specview.core.config import EngineSettings
from specview.core.errors import BackendUnavailable, Cancelled, ConfigError
from specview.core.kernels.map import (KernelMap, KernelMapError, block_starts, kernel_map, parse_widths,
                                   passes_needed, tokens_needed)
from specview.core.kernels.text import target_table
from specview.core.registry import register_backend, unregister_backend
from specview.core.inprocess import InProcessBackend
from specview.core.session import Session

PROMPTS = [[1, 5, 9, 11], [1, 7, 3, 30, 2, 8]]


class ToyLoaded(KernelToy):
    """Names: 'dispatch:WIDE:EPS' or 'noisy'."""


class ToyBackend(InProcessBackend):
    name = "kernels-toy"

    def load(self, name: str, settings: EngineSettings) -> ToyLoaded:
        return ToyLoaded(name)


@pytest.fixture()
def toy():
    register_backend("kernels-toy", ToyBackend)
    yield Session()
    unregister_backend("kernels-toy")


def direct_width(toy: ToyModel, prompt: list[int], width: int, positions: int, n_batch: int, k: int = 8):
    """One width's figures straight from the toy model's formula: no engine, no rollback."""

    def top(row):
        return np.argsort(-row, kind="stable")[:k]

    n_tok = tokens_needed([width], positions)
    first = toy.logits(prompt, min(len(prompt), n_batch))  # the prefill's last chunk
    seq = [int(np.argmax(first))]
    single = {0: first}
    for j in range(1, n_tok):
        single[j] = toy.logits(prompt + seq[:j], 1)
        seq.append(int(np.argmax(single[j])))
    out = []
    for s in block_starts(width, positions):
        for i in range(width):
            j = s + i
            row = toy.logits(prompt + seq[:j], width)
            a = single[j]
            same = bool(np.array_equal(a.view(np.uint32), row.view(np.uint32)))
            u = np.union1d(top(a), top(row))
            delta = 0.0 if same else float(np.max(np.abs(a[u].astype(np.float64) - row[u])))
            srt = np.sort(a)[::-1]
            out.append((same, delta, int(np.argmax(a)) != int(np.argmax(row)), float(srt[0] - srt[1])))
    return out


def test_planted_kernel_switch_gives_the_safe_widths_and_n_max(toy):
    km = kernel_map(toy, ["dispatch:5:0.05"], PROMPTS, widths=range(1, 9), positions=10, backend="kernels-toy")
    t = km.targets[0]
    assert t.deterministic
    assert t.safe_widths() == [1, 2, 3, 4]
    assert t.safe_n_max() == 3 and km.safe_n_max("dispatch:5:0.05") == 3
    for w in range(1, 9):
        st = t.widths[w]
        assert st.rows == len(PROMPTS) * len(block_starts(w, 10)) * w
        assert st.identical == (st.rows if w < 5 else 0)
        assert (st.max_delta == 0.0) == (w < 5)
        assert sum(st.differing_by_row) == st.rows - st.identical
        assert st.first_difference == (None if w < 5 else ("tokens1", 1, 0))  # the earliest, not the first run
    assert [p.tokens[:3] for p in t.prompts] == [ToyModel(0).greedy(p, 3) for p in PROMPTS]
    text = km.table()
    assert "n_max <= 3 is proven lossless" in text and "width 5 differs" in text
    assert "tokens1 tokens 1-10" in text


@pytest.mark.parametrize("width", [1, 3, 6])
def test_one_width_matches_a_direct_computation(toy, width):
    eps = 1.0  # large enough that some argmaxes flip
    km = kernel_map(toy, [f"dispatch:3:{eps}"], PROMPTS, widths=[width], positions=11, backend="kernels-toy")
    st = km.targets[0].widths[width]
    rows = [r for p in PROMPTS for r in direct_width(DispatchToy(3, eps), p, width, 11, 512)]
    deltas = np.array([r[1] for r in rows])
    assert st.rows == len(rows)
    assert st.identical == sum(r[0] for r in rows)
    assert st.flips == sum(r[2] for r in rows) == len(st.flip_at)
    assert st.max_delta == pytest.approx(deltas.max(), abs=1e-6)
    assert st.p95_delta == pytest.approx(np.percentile(deltas, 95), abs=1e-6)
    assert st.below_shift == sum(1 for r in rows if r[3] < deltas.max())
    if width >= 3:
        assert st.flips > 0 and st.identical == 0  # the planted error is big enough to be seen
    else:
        assert st.identical == st.rows and st.flips == 0


def test_a_nondeterministic_backend_proves_nothing(toy):
    km = kernel_map(toy, ["noisy"], PROMPTS[:1], widths=[1, 2], positions=6, backend="kernels-toy")
    t = km.targets[0]
    assert not t.deterministic
    assert t.widths[1].identical < t.widths[1].rows
    assert t.safe_widths() == [] and t.safe_n_max() is None
    assert "NOT DETERMINISTIC" in km.table()


def test_json_round_trip_and_heatmap(toy, tmp_path):
    km = kernel_map(toy, ["dispatch:3:1.0", "dispatch:9:1.0"], PROMPTS, widths=range(1, 5), positions=8,
                    settings=[EngineSettings(flash_attn="on"), EngineSettings(flash_attn="off")], backend="kernels-toy")
    assert [t.label for t in km.targets] == ["dispatch:3:1.0 [fa on]", "dispatch:3:1.0 [fa off]",
                                             "dispatch:9:1.0 [fa on]", "dispatch:9:1.0 [fa off]"]
    p = km.save(tmp_path / "k.json")
    raw = json.loads(p.read_text())
    assert raw["schema"] == "specview.kernels/1"
    assert raw["targets"][2]["safe_n_max"] == 3 and raw["targets"][0]["safe_n_max"] == 1
    back = KernelMap.load(p)
    assert back.table() == km.table() and back.heatmap() == km.heatmap()
    assert back.target("dispatch:3:1.0 [fa on]").settings.flash_attn == "on"
    with pytest.raises(KeyError, match="several settings"):
        back.target("dispatch:3:1.0")
    assert back.safe_widths("dispatch:9:1.0", EngineSettings(flash_attn="off")) == [1, 2, 3, 4]
    heat = km.heatmap().splitlines()
    row = next(line for line in heat if line.startswith("dispatch:3:1.0 [fa off]"))
    cells = [row[i:i + 3] for i in range(row.index("|") + 1, len(row), 3)]
    assert cells[0].strip() == "=" and cells[1].strip() == "=" and "!" in cells[2] + cells[3]
    labels, widths, grid = km.grid("identical_share")
    assert widths == [1, 2, 3, 4] and grid[2] == [1.0, 1.0, 1.0, 1.0] and grid[0][2] == 0.0


@pytest.mark.parametrize("content,match", [
    ("{", "not valid JSON"),
    ('{"schema": "specview.trace/1"}', "not a specview kernel map"),
    ('{"schema": "specview.kernels/9"}', "not supported"),
    ('{"schema": "specview.kernels/1", "backend": "x", "widths": [1], "positions": 2, "top_k": 8, '
     '"prompts": [], "targets": [{"widths": [{"width": 1, "rows": 2, "identical": 3, "flips": 0}], '
     '"prompts": []}]}', "3 identical rows of 2"),
    ('{"schema": "specview.kernels/1", "backend": "x", "widths": [1], "positions": 2, "top_k": 8, '
     '"prompts": [], "targets": [{"widths": [], "prompts": []}]}', "malformed kernel map"),
])
def test_bad_files_are_named(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(KernelMapError, match=match) as info:
        KernelMap.load(p)
    assert str(p) in str(info.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(KernelMapError, match="no such file"):
        KernelMap.load(tmp_path / "none.json")


def test_parse_widths():
    assert parse_widths("1-4,8") == (1, 2, 3, 4, 8)
    assert parse_widths("2-3") == (1, 2, 3)  # the width-1 control is always measured
    for bad in ("0-3", "4-2", "x", "1-y"):
        with pytest.raises(ConfigError):
            parse_widths(bad)


def test_cost_and_cancel(toy):
    assert passes_needed([1, 2, 4], 8, 2) == 2 * ((tokens_needed([1, 2, 4], 8) - 1) + 8 + 4 + 2)
    seen = []
    calls = iter(range(10_000))
    with pytest.raises(Cancelled):
        kernel_map(toy, ["dispatch:5:0.1"], PROMPTS, widths=[1, 2], positions=8, backend="kernels-toy",
                   cancel=lambda: next(calls) > 5, on_fraction=seen.append)
    assert seen and all(0 < f < 1 for f in seen)
    fr = []
    kernel_map(toy, ["dispatch:5:0.1"], PROMPTS, widths=[1, 2], positions=8, backend="kernels-toy",
               on_fraction=fr.append)
    assert fr[-1] == pytest.approx(1.0) and fr == sorted(fr)


def test_refusals(toy):
    with pytest.raises(ConfigError, match="batch size is 4"):
        kernel_map(toy, ["dispatch:5:0.1"], PROMPTS, widths=range(1, 9), positions=8, backend="kernels-toy",
                   settings=EngineSettings(n_batch=4))
    with pytest.raises(ConfigError, match="positions"):
        kernel_map(toy, ["dispatch:5:0.1"], PROMPTS, positions=0, backend="kernels-toy")
    with pytest.raises(KernelMapError, match="neither"):
        kernel_map(toy, ["dispatch:5:0.1"], [3.5], backend="kernels-toy")

    class ServerLike:
        def run(self, *a, **k):
            raise AssertionError

    with pytest.raises(BackendUnavailable, match="--engine llama.cpp"):
        kernel_map(ServerLike(), ["x"], PROMPTS, backend="llama-server")


def test_stop_at_difference_answers_the_same_widths_for_less(toy):
    args = (toy, ["dispatch:4:1.0"], PROMPTS)
    kw = dict(widths=range(1, 7), positions=12, backend="kernels-toy")
    full = kernel_map(*args, **kw).targets[0]
    fr = []
    quick = kernel_map(*args, **kw, stop_at_difference=True, on_fraction=fr.append).targets[0]
    assert quick.safe_widths() == full.safe_widths() == [1, 2, 3]
    for w in range(1, 7):
        a, b = full.widths[w], quick.widths[w]
        if w < 4:
            assert (b.rows, b.identical, b.stopped) == (a.rows, a.identical, False)
        else:
            assert b.stopped and b.rows == w < a.rows and b.identical == 0  # one block, then no more
    assert fr[-1] == pytest.approx(1.0)
    assert "stopped at the first difference" in target_table(quick)


def test_a_map_without_figures_or_with_infinite_counts_is_read_or_refused_by_name(toy, tmp_path):
    km = kernel_map(toy, ["dispatch:3:1.0"], PROMPTS[:1], widths=range(1, 5), positions=8, backend="kernels-toy")
    st = km.targets[0].widths[4]
    assert not st.bit_identical
    st.max_delta = math.nan  # a differing width whose shift was not recorded: the heatmap marks it the worst
    row = next(line for line in km.heatmap().splitlines() if line.startswith("dispatch:3:1.0"))
    assert row.rstrip().endswith("#!") or row.rstrip().endswith("#")
    p = km.save(tmp_path / "k.json")
    raw = json.loads(p.read_text())
    raw["targets"][0]["prompts"][0]["positions"] = math.inf  # json writes Infinity; int() of it overflows
    p.write_text(json.dumps(raw))
    with pytest.raises(KernelMapError, match="malformed kernel map") as info:
        KernelMap.load(p)
    assert str(p) in str(info.value)
