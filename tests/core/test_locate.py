"""locate's graph comparison on a toy engine whose batched passes depart at a planted node."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import ToyText
from specview.core.engine import Engine
from specview.core.errors import ConfigError
from specview.core.locate.find import (GraphEngine, GraphNode, Located, LocateError, MicroBatch, NotObservable,
                                  compare_values, layer_of, locate, token_axis)

N_VOCAB, N_EMBD, N_KV, N_HEAD = 16, 4, 8, 2


def row_values(token: int, pos: int, size: int) -> np.ndarray:
    return np.sin(np.arange(size, dtype=np.float32) * 0.37 + token * 1.3 + pos * 0.11).astype(np.float32)


class ToyEngine(ToyText, Engine, GraphEngine):
    """Logits and nodes that depend only on (token, position), except where a pass of width >= ``bad_width``
    adds ``delta`` from node ``ffn_out-1`` on; with ``observer_changes`` an observed pass of every node moves the
    logits (as a backend whose fused kernels stop fusing would)."""

    backend = "toy"

    def __init__(self, bad_width: int, delta: float, selection: str = "all", observer_changes: bool = False):
        super().__init__()
        self.bad_width, self.delta, self.selection, self.observer_changes = bad_width, delta, selection, observer_changes
        self._n_ctx, self._n_batch = 256, 64
        self.closed = False

    def _rows(self, tokens, observed: bool):
        T = len(tokens)
        bad = T >= self.bad_width
        out = {}
        for name, size in (("embd", N_EMBD), ("ffn_out-0", N_EMBD), ("ffn_out-1", N_EMBD), ("l_out-1", N_EMBD),
                           ("result_output", N_VOCAB)):
            rows = np.stack([row_values(t, self.n_past + i, size) for i, t in enumerate(tokens)])
            if bad and name in ("ffn_out-1", "l_out-1", "result_output"):
                rows[:, 0] += self.delta * (2 if name == "result_output" else 1)
            if observed and self.observer_changes and self.selection == "all" and name == "result_output":
                rows[:, 1] += 1e-3
            out[name] = rows
        return out

    def eval(self, tokens, rows):
        vals = self._rows(tokens, observed=False)
        self.n_past += len(tokens)
        self.n_evals += 1
        return vals["result_output"][list(rows)]

    def observe(self, tokens, rows):
        T = len(tokens)
        vals = self._rows(tokens, observed=True)
        nodes = []

        def add(name, op, ne, values, state=False):
            nodes.append(GraphNode(index=len(nodes), name=name, op=op, type="f32", ne=ne, buffer="CPU", values=values,
                                   state=state))

        add("embd", "GET_ROWS", (N_EMBD, T, 1, 1), vals["embd"])
        # kq-0: [n_kv, n_tokens, n_head]; every row but the last differs between widths unless sliced correctly
        kq = np.zeros((1, N_HEAD, T, N_KV), np.float32)
        for i in range(T):
            kq[0, :, i, :] = row_values(tokens[i], self.n_past + i, N_KV)
        add("kq-0", "MUL_MAT", (N_KV, T, N_HEAD, 1), kq)
        add("cache_k_l0 (view)", "SET_ROWS", (N_EMBD, N_KV, 1, 1), np.random.default_rng(T).random((N_KV, N_EMBD),
            dtype=np.float32), state=True)
        if self.selection == "all":
            add("ffn_out-0", "MUL_MAT", (N_EMBD, T, 1, 1), vals["ffn_out-0"])
            add("ffn_out-1", "MUL_MAT", (N_EMBD, T, 1, 1), vals["ffn_out-1"])
        add("l_out-1", "ADD", (N_EMBD, T, 1, 1), vals["l_out-1"])
        add("result_output", "MUL_MAT", (N_VOCAB, T, 1, 1), vals["result_output"])
        logits = self.eval(tokens, rows)
        if self.observer_changes and self.selection == "all":
            logits = logits.copy()
            logits[:, 1] += 1e-3
        return logits, [MicroBatch(first_row=0, width=T, nodes=nodes)]

    def truncate(self, n):
        assert 0 <= n <= self.n_past
        self.n_past = n

    def take_state(self, other):
        self.n_past = other.n_past

    def close(self):
        self.closed = True


class ToyModel:
    path = "toy"
    chat_note = None

    def __init__(self, **kw):
        self.kw = kw or {"bad_width": 2, "delta": 0.1}
        self.opened: list[ToyEngine] = []

    @property
    def vocab(self):
        return ToyEngine(1, 0).vocab

    def tokenize(self, text, *, chat=False):
        return ToyEngine(1, 0).tokenize(text)

    def facts(self):
        return {"path": "toy"}

    def observed_engine(self, settings, n_ctx, selection="all"):
        e = ToyEngine(selection=selection, **self.kw)
        self.opened.append(e)
        return e


class ToySession:
    def __init__(self, model):
        self.m = model
        self.plain = ToyEngine(**{k: v for k, v in model.kw.items() if k != "observer_changes"})

    def model(self, backend, name, settings):
        return self.m

    def engine(self, role, model, settings, n_ctx):
        return self.plain


@pytest.mark.parametrize("row", [0, 1, 3])
def test_the_planted_node_is_the_first_that_differs(row):
    model = ToyModel(bad_width=3, delta=0.25)
    loc = locate(ToySession(model), "toy", width=4, row=row, position=6, prompt="abc")
    assert loc.first is not None and loc.first.name == "ffn_out-1" and loc.first.op == "MUL_MAT"
    assert loc.first.max_abs == pytest.approx(0.25) and loc.first.n_diff == 1 and loc.first.n_elems == N_EMBD
    # the kq node was sliced along its middle axis: its row is identical, though the other rows are not
    kq = next(d for d in loc.nodes if d.name == "kq-0")
    assert kq.status == "identical" and kq.token_axis == 1
    state = next(d for d in loc.nodes if d.name.startswith("cache_k"))
    assert state.status == "skipped" and "KV cache" in state.note
    assert loc.logits.n_diff == 1 and loc.logits.max_abs == pytest.approx(0.5)
    assert loc.observer_exact and loc.selection == "all"
    assert all(e.closed for e in model.opened)
    assert [p["part"] for p in loc.per_layer()] == ["input", "blk.0", "blk.1", "output"]


def test_a_width_below_the_planted_one_is_identical():
    loc = locate(ToySession(ToyModel(bad_width=3, delta=0.25)), "toy", width=2, row=1, position=4, prompt="abc")
    assert loc.identical and loc.first is None and loc.logits.n_diff == 0
    assert "bit-identical" in loc.where()


def test_an_observer_that_moves_the_logits_falls_back_to_fewer_nodes_and_says_so():
    model = ToyModel(bad_width=3, delta=0.25, observer_changes=True)
    loc = locate(ToySession(model), "toy", width=4, row=0, position=3, prompt="abc")
    assert [e.selection for e in model.opened] == ["all", "layers"]
    assert loc.selection == "layers" and loc.observer_exact
    assert any("changed the logits" in n for n in loc.notes)
    assert loc.first.name == "l_out-1"  # the nodes inside the layer were not observed


def test_json_round_trip_and_text():
    loc = locate(ToySession(ToyModel(bad_width=2, delta=1e-6)), "toy", width=2, row=0, position=2, prompt="abc")
    d = json.loads(json.dumps(loc.to_json()))
    assert d["schema"] == "specview.locate/1" and d["first"] == loc.first.index
    back = Located.from_json(d)
    assert back.text() == loc.text() and back.first.name == "ffn_out-1"
    assert "first differs at blk.1 ffn_out-1: MUL_MAT" in loc.text()
    with pytest.raises(LocateError):
        Located.from_json({"schema": "specview.kernels/1"})


def test_a_model_that_cannot_be_observed_says_so():
    class Blind:  # a loaded model with no observed_engine: an engine whose passes specview cannot look into
        path, chat_note, vocab = "blind", None, ToyModel().vocab

        def tokenize(self, text, *, chat=False):
            return [1, 5, 6]

    s = ToySession(ToyModel(bad_width=2, delta=0.1))
    s.m = Blind()
    with pytest.raises(NotObservable, match="cannot show the nodes"):
        locate(s, "toy", width=2, position=2, prompt="abc")


def test_bad_rows_and_positions_are_refused():
    s = ToySession(ToyModel(bad_width=2, delta=0.1))
    with pytest.raises(Exception, match="row"):
        locate(s, "toy", width=2, row=2, prompt="abc")
    with pytest.raises(Exception, match="position"):
        locate(s, "toy", width=4, row=3, position=2, prompt="abc")
    with pytest.raises(ConfigError, match=r"^width must be at least 1, .* \(got 0\)$") as ei:
        locate(s, "toy", width=0, prompt="abc")
    assert ei.value.setting == "width"  # the CLI names --width, not --row


def test_show_of_a_trace_points_to_locate_trace(tmp_path, capsys):
    from specview.cli import main

    t = tmp_path / "run.json"
    t.write_text('{"schema": "specview.trace/1", "config": {}}')
    assert main(["locate", "--show", str(t)]) == 2
    assert capsys.readouterr().err.strip() == (f"specview: error: --show {t}: a specview trace, not a locate; to "
                                               f"locate its fork, run `specview locate --trace {t}`")


def test_token_axis_by_shape():
    assert token_axis((576, 1, 1, 1), (576, 4, 1, 1), 4) == 1
    assert token_axis((256, 1, 9, 1), (256, 9, 9, 1), 9) == 1  # n_head 9 = width 9: the shapes tell which
    assert token_axis((64, 9, 1, 1), (64, 9, 4, 1), 4) == 2
    assert token_axis((192, 512, 1, 1), (192, 512, 1, 1), 4) is None
    assert token_axis((256, 1, 9, 1), (512, 4, 9, 1), 4) is None  # n_kv grew too: not a row


def test_compare_values_counts_bits_and_handles_infinities():
    a = np.array([0.0, 1.0, -np.inf, np.nan, 2.0], np.float32)
    b = np.array([-0.0, 1.0, -np.inf, np.nan, 2.5], np.float32)
    n, mx, rel = compare_values(a, b)
    assert n == 2 and mx == pytest.approx(0.5) and rel == pytest.approx(0.25)
    assert compare_values(a, a.copy()) == (0, 0.0, 0.0)


def test_layer_names():
    assert layer_of("ffn_out-3") == 3 and layer_of("cache_k_l12 (view)") == 12 and layer_of("Qcur-0 (reshaped)") == 0
    assert layer_of("result_output") is None and layer_of("node_21") is None
