"""The kernel map groups its widths by cause: a toy engine with two planted causes at two widths."""

from __future__ import annotations

import json

import numpy as np

from specview.core.config import EngineSettings
from fakes import ToyText
from specview.core.engine import Engine
from specview.core.kernels.causes import (first_differing, groups_line, locate_causes, prescription_lines, remedies,
                                         width_groups)
from specview.core.kernels.map import KernelMap, kernel_map
from specview.core.locate.find import GraphEngine, GraphNode, MicroBatch, NodeSource
from specview.core.report.kernels import target_facts, width_rows

N_VOCAB, N_EMBD = 16, 4
REPACK_FROM, ATTN_FROM = 3, 5  # widths >= 3 differ at the repacked ffn mat-mul; >= 5 already in layer 0's attention
FFN_W = NodeSource(name="blk.1.ffn_down.weight", op="NONE", type="q4_K", shape=(N_EMBD, N_EMBD), buffer="CPU_REPACK",
                   weight=True)


def vals(token: int, pos: int, size: int) -> np.ndarray:
    return np.cos(np.arange(size, dtype=np.float32) * 0.29 + token * 0.7 + pos * 0.13).astype(np.float32)


class TwoCauses(ToyText, Engine, GraphEngine):
    backend = "toy"

    def __init__(self):
        super().__init__()
        self._n_ctx, self._n_batch = 256, 64
        self.observed_passes = 0

    def _rows(self, tokens):
        T = len(tokens)
        out = {}
        for name, size in (("embd", N_EMBD), ("kqv_out-0", N_EMBD), ("ffn_out-0", N_EMBD), ("ffn_out-1", N_EMBD),
                           ("result_output", N_VOCAB)):
            out[name] = np.stack([vals(t, self.n_past + i, size) for i, t in enumerate(tokens)])
        if T >= ATTN_FROM:
            for name in ("kqv_out-0", "ffn_out-0"):
                out[name][:, 1] += 1e-6
        if T >= REPACK_FROM:
            out["ffn_out-1"][:, 0] += 1e-6
            out["result_output"][:, 0] += 0.01
        return out

    def eval(self, tokens, rows):
        v = self._rows(tokens)
        self.n_past += len(tokens)
        self.n_evals += 1
        return v["result_output"][list(rows)]

    def observe(self, tokens, rows):
        self.observed_passes += 1
        T = len(tokens)
        v = self._rows(tokens)
        nodes = []
        for name, op, src in (("embd", "GET_ROWS", []), ("kqv_out-0", "CONT", []), ("ffn_out-0", "MUL_MAT", []),
                              ("ffn_out-1", "MUL_MAT", [FFN_W]), ("result_output", "MUL_MAT", [])):
            size = v[name].shape[1]
            nodes.append(GraphNode(index=len(nodes), name=name, op=op, type="f32", ne=(size, T, 1, 1), buffer="CPU",
                                   sources=list(src), values=v[name]))
        return self.eval(tokens, rows), [MicroBatch(first_row=0, width=T, nodes=nodes)]

    def truncate(self, n):
        self.n_past = n

    def take_state(self, other):
        self.n_past = other.n_past


class Model:
    path = "toy"
    chat_note = None

    def __init__(self):
        self.observed: list[TwoCauses] = []

    @property
    def vocab(self):
        return TwoCauses().vocab

    def tokenize(self, text, *, chat=False):
        return TwoCauses().tokenize(text)

    def facts(self):
        return {"path": "toy", "quantization": "toy"}

    def observed_engine(self, settings, n_ctx, selection="all"):
        e = TwoCauses()
        self.observed.append(e)
        return e


class Session:
    def __init__(self):
        self.m = Model()
        self.plain = TwoCauses()

    def model(self, backend, name, settings):
        return self.m

    def engine(self, role, model, settings, n_ctx):
        return self.plain

    def job(self, fn, *args, **kwargs):  # a Session's one door: the job runs here, where the models are
        return fn(self, *args, **kwargs)


def located_map(widths=range(1, 7)):
    s = Session()
    km = kernel_map(s, ["toy"], ["hello there"], widths, 12, EngineSettings(), backend="toy")
    return s, locate_causes(s, km)


def test_widths_group_by_the_planted_op_they_first_differ_at():
    s, km = located_map()
    t = km.targets[0]
    groups = width_groups(t)
    assert [(g["kind"], g["widths"]) for g in groups] == [("identical", [1, 2]), ("differs", [3, 4]),
                                                          ("differs", [5, 6])]
    repack, attn = groups[1]["cause"], groups[2]["cause"]
    assert (repack["node"], repack["op"], repack["weight_type"], repack["weight_buffer"]) == (
        "ffn_out-1", "MUL_MAT", "q4_K", "CPU_REPACK")
    assert attn["node"] == "kqv_out-0" and attn["weight_buffer"] is None
    line = groups_line(t)
    assert line.startswith("1-2 identical; 3-4 differ first in the repacked q4_K mat-mul (ffn_out, MUL_MAT q4_K in "
                           "CPU_REPACK); 5-6 differ first in attention (kqv_out")
    # one locate per differing width (one observed context, two observed passes), none for an identical one
    assert len(s.m.observed) == 4 and all(e.observed_passes == 2 for e in s.m.observed)
    for w in (1, 2):
        assert t.widths[w].cause is None
    for w in range(3, 7):  # each located at the row the map recorded first
        prompt, j, i = t.widths[w].first_difference
        c = t.widths[w].cause
        assert (c["prompt"], c["position"], c["row"], c["width"]) == (prompt, j, i, w)
        assert c["observer_exact"] and c["logits_differ"] > 0
    assert t.locate_seconds is not None and t.locate_seconds <= t.seconds


def test_each_cause_names_the_setting_that_removes_it():
    _, km = located_map()
    t = km.targets[0]
    g = width_groups(t)
    fix_repack = [f for f, _ in remedies(g[1]["cause"], t.settings)]
    fix_attn = [f for f, _ in remedies(g[2]["cause"], t.settings)]
    assert "--no-repack" in fix_repack and "-fa off" not in fix_repack and "-ub 1" in fix_repack
    assert "-fa off" in fix_attn and "--no-repack" not in fix_attn
    off = remedies(g[2]["cause"], EngineSettings(flash_attn="off", n_ubatch=1))
    assert off == []  # attention with flash attention off and -ub 1 already: nothing left to switch here
    assert first_differing(t) == REPACK_FROM
    lines = prescription_lines(t)
    assert any(f"--spec-draft-n-max {REPACK_FROM - 2}:" in x for x in lines)
    assert any(x.strip().startswith("widths 3-4: removed by --no-repack") for x in lines)


def test_causes_survive_json_and_show_in_the_table_and_the_report(tmp_path):
    _, km = located_map()
    p = km.save(tmp_path / "km.json")
    back = KernelMap.load(p)
    t0, t1 = km.targets[0], back.targets[0]
    assert [s.cause for _, s in sorted(t1.widths.items())] == json.loads(json.dumps(
        [s.cause for _, s in sorted(t0.widths.items())]))
    assert groups_line(t1) == groups_line(t0)
    assert "  widths by cause: " + groups_line(t0) in back.table()
    facts = dict(target_facts(t1))
    assert facts["widths by cause"] == groups_line(t0)
    notes = {int(r[0]): r[-1] for r in width_rows(t1)}
    assert "ffn_out-1" in notes[3] and "kqv_out-0" in notes[5] and "first differs" not in notes[2]


def test_a_map_without_causes_reads_as_before(tmp_path):
    s = Session()
    km = kernel_map(s, ["toy"], ["hello there"], range(1, 5), 8, EngineSettings(), backend="toy")
    d = km.to_json()
    assert all("cause" not in w for w in d["targets"][0]["widths"]) and "locate_seconds" not in d["targets"][0]
    back = KernelMap.from_json(json.loads(json.dumps(d)))
    t = back.targets[0]
    assert groups_line(t) == "" and "widths by cause" not in back.table() and prescription_lines(t) == []
    assert [g["text"] for g in width_groups(t)][-1].startswith("3-4 differ where, not located")
    assert not s.m.observed  # no locate ran
