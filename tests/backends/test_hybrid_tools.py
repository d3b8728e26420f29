"""Every tool on the tiny hybrids (Qwen3.5: a gated delta net; LFM2: short convolutions), on real llama.cpp.

* ``locate``: the recurrent ops are compared on their per-token rows (their outputs pack those rows with a
  state), the recurrent state buffers are named as such, and every node it skips says why; on the fork of a
  run whose rollback is planted with a fault it names the recurrent ops of the fork's verify pass.
* the kernel map: a hybrid's context cannot drop positions, so each block runs on a checkpoint of the walk's
  own state and the restore replays nothing; the width-1 control is bit-identical in every rollback mode,
  every width is covered and the counts add up, and its walk is plain greedy decoding.
* the backend check: a pair of setups on each hybrid is sane, every position and width is compared, and a
  planted broken build on the same hybrid is flagged.
* the matrix and its suite rates over both hybrids, their drafters, n_max and both rollback modes: every cell
  runs in the mode it asks for and rolls back by it, the rates' counts add up to the cells, every cell has a
  verdict, and the rollback modes are compared text for text; the built-in suite as a --suite matrix on a
  hybrid with a planted fault stops each fork a few tokens on and counts it per setting and per category.
* the prescription on quantized copies of both hybrids: every rollback mode is measured at the largest n_max
  the map proves, proven exactly when every speculative row equals vanilla's bit for bit through its
  rollbacks, and the fastest proven one is prescribed; a fault planted in the snapshot path is never
  prescribed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import door  # noqa: E402
from tinyhybrid import hybrid_pair  # noqa: E402

from fakes import FaultyBackend  # noqa: E402

from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.registry import register_backend, unregister_backend  # noqa: E402
from specview.core.locate.find import fork_of, locate  # noqa: E402
from specview.core.session import Session  # noqa: E402

pytest.importorskip("llama_cpp")

ARCHS = ("qwen35", "lfm2")
#: what the tiny writers put in each layer: the recurrent ops locate must find and compare
RECURRENT = {"qwen35": {"GATED_DELTA_NET", "SSM_CONV", "CONCAT"}, "lfm2": {"SSM_CONV", "CONCAT"}}
SKIP_REASONS = ("recurrent state", "KV cache view")
ENGINE = EngineSettings(threads=1, flash_attn="off", kv_type="f32")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid-tools")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


@pytest.fixture(scope="module")
def session():
    s = Session()
    yield s
    s.close()


@pytest.fixture(scope="module")
def located(pairs, session):
    return {arch: locate(session, str(pairs[arch][0]), width=4, row=2, prompt="the cat", chat=False,
                         settings=ENGINE) for arch in ARCHS}


def by_name(loc, name):
    return next(d for d in loc.nodes if d.name == name)


@pytest.mark.parametrize("arch", ARCHS)
def test_locate_compares_the_recurrent_ops_on_their_per_token_rows(located, arch):
    loc = located[arch]
    assert loc.observer_exact
    rec = loc.recurrent()
    assert {d.op for d in rec} == RECURRENT[arch]
    for d in rec:  # every recurrent op compared, none skipped for its shape
        assert d.status in ("identical", "differs") and d.n_elems > 0, (d.name, d.note)
    packed = [d for d in rec if d.op in ("GATED_DELTA_NET", "CONCAT")]
    assert packed and all("state rows" in d.note and d.shape != d.batched_shape for d in packed)
    # the packed row is the token's own: the node that holds the same rows unpacked differs exactly as much
    for d in packed:
        if d.op == "GATED_DELTA_NET":  # attn_output-N views the tokens' rows of its output
            same = by_name(loc, f"attn_output-{d.layer}")
        else:  # a CONCAT of the conv state and the tokens' inputs: its second source is those inputs
            same = [n for n in loc.nodes[:d.index] if n.name == d.sources[1].name][-1]
        assert same.status != "skipped" and same.n_elems == d.n_elems
        assert (same.n_diff, same.max_abs) == (d.n_diff, d.max_abs), (d.name, same.name)
    text = loc.text()
    assert "recurrent ops (compared on their per-token rows)" in text
    assert all(d.name in text for d in rec)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_skipped_node_says_why_and_the_state_buffers_are_recurrent_state(located, arch):
    loc = located[arch]
    skipped = [d for d in loc.nodes if d.status == "skipped"]
    assert skipped and all(d.note for d in skipped)
    assert not [d.name for d in skipped if "shapes differ beyond the token axis" in d.note]
    cache_rs = [d for d in loc.nodes if d.name.startswith(("cache_r_l", "cache_s_l"))]
    assert cache_rs and all(d.note.startswith("recurrent state (") and "Kcur" not in d.note for d in cache_rs)
    kv = [d for d in loc.nodes if d.name.startswith(("cache_k_l", "cache_v_l"))]
    assert kv and all(d.note.startswith("KV cache view") for d in kv)
    # the compared and skipped nodes add up to every observed node
    assert loc.count("identical") + loc.count("differs") + loc.count("skipped") == len(loc.nodes)


@pytest.fixture
def planted():
    from specview.backends.llama_cpp import LlamaBackend

    fb = FaultyBackend(LlamaBackend(), name="hybrid-tools-planted")
    register_backend("hybrid-tools-planted", lambda: fb)
    yield fb
    unregister_backend("hybrid-tools-planted")


def test_locate_on_a_planted_qwen35_fork_names_the_recurrent_ops_of_its_verify_pass(pairs, session, planted):
    target, draft = pairs["qwen35"]
    planted.faults[str(target)] = "checkpoint-late"  # the restored state already holds a token: a fork
    trace = None
    for prompt in ("the cat and the dog", "a model of the target", "history of the essay"):
        run = Session()
        try:
            trace = run.run(RunConfig(backend="hybrid-tools-planted", target=str(target), draft=str(draft),
                                      prompt=prompt, chat=False, max_tokens=48, ignore_eos=True,
                                      engine=EngineSettings(threads=1, rollback="checkpoint")))
        finally:
            run.close()
        if not trace.comparison.identical:
            break
    assert trace is not None and not trace.comparison.identical, "the planted fault never forked"
    args = dict(fork_of(trace), backend="llama.cpp")  # the clean engine, on the fork's own verify pass
    loc = locate(session, **args)
    assert loc.source == "trace" and loc.width == trace.speculative.steps[loc.position].batch_size
    if loc.width > 1:
        assert {d.op for d in loc.recurrent()} == RECURRENT["qwen35"]
        assert all(d.status != "skipped" for d in loc.recurrent())
    assert all(d.note for d in loc.nodes if d.status == "skipped")
    assert "recurrent ops" in loc.text() or loc.width == 1


# -- the kernel map ------------------------------------------------------------------------------------------
WIDTHS = (1, 2, 4)
POSITIONS = 16


@pytest.fixture(scope="module")
def maps(pairs, session):
    """{(arch, rollback): (target map, every Rollback the map's truncates returned)}."""
    from specview.backends.llama_cpp.engine import LlamaEngine
    from specview.core.kernels.map import map_in_session
    from specview.core.prompts import PromptSpec

    out = {}
    real = LlamaEngine.truncate
    for arch in ARCHS:
        for rollback in ("checkpoint", "snapshots"):
            done: list = []

            def truncate(self, n, _done=done):
                rb = real(self, n)
                _done.append(rb)
                return rb

            LlamaEngine.truncate = truncate
            try:
                km = map_in_session(session, [str(pairs[arch][0])],
                                    [PromptSpec(name="cat", text="the cat", chat=False)], widths=WIDTHS,
                                    positions=POSITIONS,
                                    settings=EngineSettings(threads=1, rollback=rollback))
            finally:
                LlamaEngine.truncate = real
            out[arch, rollback] = (km.targets[0], done)
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("rollback", ["checkpoint", "snapshots"])
def test_the_kernel_map_measures_a_hybrid_on_the_walks_own_state(maps, pairs, arch, rollback):
    tm, done = maps[arch, rollback]
    assert tm.deterministic, tm.widths[1].first_difference  # the width-1 control: bit-identical after each restore
    assert sorted(tm.widths) == list(WIDTHS)
    for w, st in tm.widths.items():
        assert st.rows == -(-POSITIONS // w) * w  # every row of every block
        assert sum(st.differing_by_row) == st.rows - st.identical and len(st.differing_by_row) == w
        assert st.flips <= st.rows - st.identical
    # every block was restored (a checkpoint, or a kept state for a width-1 block in a snapshot context)
    blocks = sum(-(-POSITIONS // w) for w in WIDTHS)
    restores = [rb for rb in done if rb is not None and rb.mode != "seq-rm"]
    assert len(restores) == blocks
    if rollback == "checkpoint":  # a checkpoint at every block's start: nothing was decoded again
        assert all(rb.mode == "checkpoint" and rb.replay == 0 for rb in restores)
    # the walk is plain greedy decoding of the prompt (the in-process vanilla arm, EOS not stopping it)
    walk = tm.prompts[0].tokens
    run = Session()
    try:
        van = run.run(RunConfig(target=str(pairs[arch][0]), prompt="the cat", chat=False, max_tokens=len(walk),
                                spec_type="ngram-simple", engine=EngineSettings(threads=1))).vanilla
    finally:
        run.close()
    assert van.tokens == walk[:len(van.tokens)] and len(van.tokens) >= 8


# -- the backend check ---------------------------------------------------------------------------------------
CHECK_PROMPT = "the cat"
#: the pair checked: flash attention off (the reference) against on, both at one thread (a two-thread context
#: crawls on a loaded machine, and which pair is checked does not matter to what is tested here)
REF, TEST = dict(threads=1, flash_attn="off"), dict(threads=1, flash_attn="on")


def check(session, backend, target):
    """The backend check of ``target`` on the pair above, in this process."""
    from specview.core.diagnose.reference import Pair, run_check

    pair = Pair("threads", door.settings(target=target, **REF), door.settings(target=target, **TEST), "fa off",
                "fa on")
    ids = door.model(target, vocab_only=True).tokenize(CHECK_PROMPT, chat=False)
    return len(ids), run_check(session, backend=backend, target=str(target), settings=EngineSettings(threads=1),
                               prompts=[("cat", ids)], continuation=6, widths=(1, 2, 4), pair=pair)


@pytest.fixture
def broken_backend():
    """The real llama.cpp backend, except that contexts with flash attention on compute shifted logits."""
    from test_check_llama import ShiftedEngine

    from specview.backends.llama_cpp.backend import LlamaBackend, LlamaLoaded
    from specview.backends.llama_cpp.engine import LlamaEngine

    class Loaded(LlamaLoaded):
        def new_engine(self, settings, n_ctx):
            cls = ShiftedEngine if settings.flash_attn == "on" else LlamaEngine
            return cls(self.model, settings, n_ctx=n_ctx)

    class Broken(LlamaBackend):
        name = "llama.cpp-broken-fa"

        def load(self, name, settings):
            return Loaded(super().load(name, settings).model)

    register_backend(Broken.name, Broken)
    yield Broken.name
    unregister_backend(Broken.name)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_backend_check_on_a_hybrid_is_sane_at_every_width_and_flags_a_broken_build(pairs, session, arch,
                                                                                      broken_backend):
    target = pairs[arch][0]
    n_prompt, r = check(session, "llama.cpp", target)
    assert (r["ok"], r["problems"]) == (True, []), r
    assert r["totals"]["positions"] == n_prompt + 6 - 1 and r["totals"]["non_finite"] == 0
    assert r["totals"]["same_top1"] == 1.0  # F32 weights: the two attention paths differ in the last bits only
    assert [w["width"] for w in r["widths"]] == [1, 2, 4]
    for w in r["widths"]:  # the continuation's 5 positions, in whole passes of each width; width 1: no drift
        assert w["pair"]["positions"] == w["drift"]["positions"] == 5 // w["width"] * w["width"]
    assert r["widths"][0]["drift"]["max_logit_delta"] == 0.0
    with Session() as other:
        _, bad = check(other, broken_backend, target)
    assert bad["ok"] is False and any("top-1 token agrees" in p for p in bad["problems"])
    assert bad["totals"]["ppl_reference"] == pytest.approx(r["totals"]["ppl_reference"], rel=1e-6)


# -- the matrix and its rates -------------------------------------------------------------------------------
def test_a_matrix_over_both_hybrids_and_both_rollbacks_and_its_rates(pairs, session, tmp_path):
    from specview.core.matrix import MatrixSpec, rates, run_matrix
    from specview.core.matrix.summary import summarize
    from specview.core.prompts import PromptSpec
    from specview.core.trace import Trace
    from specview.core.verdicts import VERDICTS

    targets = [str(pairs[a][0]) for a in ARCHS]
    drafts = {str(pairs[a][0]): str(pairs[a][1]) for a in ARCHS}
    prompts = [PromptSpec("cat", text="the cat and the dog", chat=False, category="animals"),
               PromptSpec("essay", text="history of the essay", chat=False, category="essay")]
    cells = []
    for target in targets:  # each target with its own Q4_0 copy as the drafter
        spec = MatrixSpec(targets=[target], drafters=[drafts[target], "ngram-simple"], n_max=[1, 3], p_min=[0.0],
                          rollback=["checkpoint", "snapshots"], prompts=prompts, max_tokens=24, ignore_eos=True,
                          engine=EngineSettings(threads=1), diagnose=True)
        run = run_matrix(spec, session, out=tmp_path / f"{Path(target).stem}.json",
                         traces_dir=tmp_path / Path(target).stem)
        doc = run.to_json()
        # the draft model at both n_max, n-gram drafting (n_max is not its knob), each in both rollbacks, per prompt
        assert doc["status"] == "complete" and len(doc["cells"]) == doc["n_cells"] == (2 + 1) * 2 * len(prompts)
        for c in doc["cells"]:
            assert c["status"] == "ok", c.get("error")
            trace = Trace.load(tmp_path / c["trace"])  # a path relative to the matrix file's folder
            assert trace.config["context_used"]["rollback"] == c["params"]["rollback"]
            s = trace.speculative
            assert len(s.tokens) == 24 and (c["identical"] == (s.tokens == trace.vanilla.tokens))
            rolled = {r.rollback for r in s.rounds[1:] if r.rollback}
            assert bool(rolled) == (s.n_accepted < s.n_drafted)  # a rejected draft, and only that, rolls back
            assert rolled <= ({"checkpoint"} if c["params"]["rollback"] == "checkpoint" else
                              {"snapshots", "state-copy", "checkpoint"})  # snapshots fall back past their depth
            if c["params"]["drafter"] == drafts[target]:  # the Q4_0 copy is accepted in part: rollbacks happened
                assert rolled
            assert c["verdict"] in VERDICTS and (c["verdict"] == "identical") == c["identical"]
        g = rates(doc)["settings"]
        assert len(g) == 6 and sum(x["n"] for x in g) == len(doc["cells"])  # one group per setting, a cell each prompt
        assert all(x["n"] == len(prompts) and x["errors"] == 0 for x in g)
        assert sum(x["forks"] for x in g) == sum(1 for c in doc["cells"] if not c["identical"])
        for x in g:
            assert sum(cat["n"] for cat in x["categories"]) == x["n"]
        lines = summarize(doc, kernel_map=False)
        assert any(line.startswith(("The rollbacks compared", "The rollback changes the text")) for line in lines)
        cells += doc["cells"]
    assert len(cells) == 24


# -- the prescription weighs the rollback modes ---------------------------------------------------------------
@pytest.fixture(scope="module")
def quantized(pairs):
    """{arch: (a Q8_0 copy of the target, its Q4_0 drafter)}: quantized weights, whose widths a map may prove."""
    from specview.backends.llama_cpp.quantize import quantize

    return {arch: (quantize(t, Path(t).with_suffix(".Q8_0.gguf"), "Q8_0", threads=1), d)
            for arch, (t, d) in pairs.items()}


def prescription(session, target, draft):
    from specview.core.kernels.map import map_in_session
    from specview.core.matrix.prescribe import prescribe
    from specview.core.prompts import PromptSpec

    km = map_in_session(session, [str(target)], [PromptSpec(name="cat", text="the cat and the dog", chat=False)],
                        widths=(1, 2, 3, 4), positions=24, settings=EngineSettings(threads=1))
    return km.targets[0], prescribe(session, km, draft=str(draft), candidates=(1, 3), max_tokens=40, ub1=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_prescription_weighs_both_rollback_modes_of_a_hybrid(quantized, session, arch):
    from specview.core.matrix.prescribe import WEIGHED_ROLLBACKS

    tm, pres = prescription(session, *quantized[arch])
    (w,) = pres.rollbacks
    safe = tm.safe_n_max()
    assert w.own == "checkpoint"  # what llama-server does for draft-simple on a hybrid
    assert w.n_max == (safe if safe else w.n_max) and [o.mode for o in w.options] == list(WEIGHED_ROLLBACKS)
    for o in w.options:
        m = o.measurement
        assert m is not None and m.rollback == o.mode and m.n_max == w.n_max and m.speedup
        kinds = set(m.restores)
        assert kinds <= ({"checkpoint"} if o.mode == "checkpoint" else {"snapshots", "state-copy", "checkpoint"})
        # proven exactly when the map proves the widths and every row matched through at least one rollback
        assert o.proven == bool(safe and w.n_max <= safe and m.rows_exact and sum(m.restores.values())), o.why
    proven = sorted((o for o in w.options if o.proven), key=lambda o: -o.measurement.speedup)
    assert w.prescribed == (proven[0].mode if proven else None)
    assert ("prescribed: --rollback" in pres.text()) == bool(proven)
    assert pres.to_json()["rollbacks"][0]["prescribed"] == w.prescribed


def test_a_fault_in_the_snapshot_path_is_never_prescribed(quantized, monkeypatch):
    from plants_rollback import plant_in_memory

    fired = plant_in_memory(monkeypatch, "snapshot-one-back")
    with Session() as s:
        tm, pres = prescription(s, *quantized["qwen35"])
    (w,) = pres.rollbacks
    snap = next(o for o in w.options if o.mode == "snapshots")
    assert w.prescribed != "snapshots" and not snap.proven
    if tm.safe_n_max():  # the widths are proven here: the planted snapshot is what the rows caught
        assert fired and not snap.measurement.rows_exact and "rollback left another state" in snap.why


def test_a_matrix_cell_with_a_planted_rollback_fault_reads_state_and_counts_in_the_rates(pairs, planted, tmp_path):
    from specview.core.matrix import MatrixSpec, rates, run_matrix
    from specview.core.matrix.rates import SEVERITIES
    from specview.core.prompts import PromptSpec

    target, draft = pairs["qwen35"]
    planted.faults[str(target)] = "checkpoint-late"
    spec = MatrixSpec(targets=[str(target)], drafters=[str(draft)], n_max=[3], p_min=[0.0], rollback=["checkpoint"],
                      prompts=[PromptSpec(p, text=p, chat=False)
                               for p in ("the cat and the dog", "a model of the target", "history of the essay")],
                      max_tokens=48, ignore_eos=True, engine=EngineSettings(threads=1), diagnose=True,
                      backend="hybrid-tools-planted")
    with Session() as s:
        doc = run_matrix(spec, s, out=tmp_path / "m.json", traces_dir=tmp_path / "t").to_json()
    forks = [c for c in doc["cells"] if not c["identical"]]
    assert forks, "the planted fault forked no cell"
    assert all(c["verdict"] == "state" for c in forks), [c["verdict"] for c in forks]
    assert all(c["verdict"] == "identical" for c in doc["cells"] if c["identical"])
    (g,) = rates(doc)["settings"]
    assert (g["n"], g["forks"]) == (3, len(forks)) and sum(g["severity"][k] for k in SEVERITIES) == len(forks)
    assert g["positions"]["values"] == sorted(c["first_mismatch"] for c in forks)


def test_snapshots_with_a_micro_batch_llama_cpp_would_abort_on_are_refused(pairs, session):
    from specview.core.errors import ConfigError

    target, draft = pairs["qwen35"]

    def cfg(ub):
        return RunConfig(target=str(target), draft=str(draft), prompt="the cat", chat=False, max_tokens=16,
                         ignore_eos=True, n_max=3, engine=EngineSettings(threads=1, n_ubatch=ub, rollback="snapshots"))

    with pytest.raises(ConfigError) as err:  # GGML_ASSERT(n_ubatch > n_keep_tail) would abort the process
        session.run(cfg(4))
    assert err.value.setting == "n_ubatch" and "more than n_max + 1 = 4" in str(err.value)
    t = session.run(cfg(5))  # the smallest micro-batch that holds the 3 snapshots and the token before them
    assert {r.rollback for r in t.speculative.rounds[1:] if r.rollback} <= {"snapshots", "state-copy", "checkpoint"}


def test_suite_rates_over_a_hybrid_with_a_planted_rollback_fault(pairs, planted, tmp_path):
    """The built-in suite's prompts (two of each of three categories) as a ``--suite`` matrix runs them: cells stop
    a few tokens after their fork, and the rates count every fork per setting and per category."""
    from specview.core.matrix import MatrixSpec, rates, run_matrix
    from specview.core.matrix.suite import STOP_AFTER_FORK, suite

    target, draft = pairs["lfm2"]
    planted.faults[str(target)] = "replay-keeps-rejected"
    cats = ("translation", "math-reasoning", "code")
    # ASCII text only: the tests' vocabulary has no byte tokens above 0x7F, and llama.cpp's tokenizer throws
    # (std::out_of_range, an abort) on a byte it cannot map
    prompts = [p for c in cats for p in [q for q in suite([c]) if (q.text or "").isascii()][:2]]
    spec = MatrixSpec(targets=[str(target)], drafters=[str(draft)], n_max=[3], p_min=[0.0], rollback=["checkpoint"],
                      prompts=prompts, max_tokens=40, ignore_eos=True, engine=EngineSettings(threads=1, n_ctx=1024),
                      diagnose=False, stop_after_fork=STOP_AFTER_FORK, backend="hybrid-tools-planted")
    with Session() as s:
        doc = run_matrix(spec, s, out=tmp_path / "suite.json", traces_dir=tmp_path / "t").to_json()
    cells = doc["cells"]
    assert len(cells) == len(prompts) == 6 and all(c["status"] == "ok" for c in cells)
    forks = [c for c in cells if not c["identical"]]
    assert forks, "the planted fault forked no suite prompt"
    (g,) = rates(doc)["settings"]
    assert (g["n"], g["forks"], g["errors"]) == (6, len(forks), 0)
    assert g["positions"]["values"] == sorted(c["first_mismatch"] for c in forks)
    by_cat = {c["category"]: c for c in g["categories"]}
    assert set(by_cat) == set(cats) and all(by_cat[c]["n"] == 2 for c in cats)
    assert sum(c["forks"] for c in by_cat.values()) == len(forks)
    from specview.core.trace import Trace

    for c in forks:  # a suite cell keeps its fork and stops within a round of fork + STOP_AFTER_FORK
        t = Trace.load(tmp_path / c["trace"])
        n = len(t.speculative.tokens)
        assert t.comparison.first_mismatch.index == c["first_mismatch"]
        assert n <= c["first_mismatch"] + STOP_AFTER_FORK + 1 + 3
        assert n == 40 or t.speculative.stop_reason == "after-fork"
