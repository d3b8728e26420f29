"""The backend check at every verify width, against an independent computation of the same rows.

* a toy whose rows of passes at least WIDE tokens wide are off by a known
  epsilon (a planted kernel switch): its drift is zero below WIDE and exactly
  the planted error from WIDE on, while its pair (one thread against two, the
  same arithmetic) is zero at every width;
* a fake build whose multi-threaded contexts are broken is broken at every width;
* a tiny GGUF on real llama.cpp: the CPU against itself gives exact zeros at
  every width, and one thread against two gives, per width, the figures the
  test computes itself through the tests' door.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fakes import BrokenBackend, FakeEngine, KernelToy
from specview import cli
from specview.core.config import EngineSettings
from specview.core.diagnose import reference as ref
from specview.core.diagnose import ties
from specview.core.inprocess import InProcessBackend
from specview.core.registry import register_backend, unregister_backend
from specview.core.session import Session

WIDE, EPS = 3, 0.05
PROMPT = [1, 5, 9, 11, 4]


class ToyKernels(InProcessBackend):
    name = "toy-widths"
    model_kind = "name"

    def load(self, name: str, settings: EngineSettings) -> KernelToy:
        return KernelToy(name)


@pytest.fixture()
def toy():
    register_backend("toy-widths", ToyKernels)
    register_backend("broken-cpu-w", lambda: BrokenBackend(gpu=False, name="broken-cpu-w"))
    yield
    unregister_backend("toy-widths")
    unregister_backend("broken-cpu-w")


def _toy_drift(seq: list[int], start: int, width: int) -> float:
    """max |row at width - row at width 1| over the positions start.. whole passes of ``width`` cover, straight
    from the toy's formula."""
    toy = KernelToy(f"dispatch:{WIDE}:{EPS}").toy
    worst = 0.0
    for i in range(start, start + (len(seq) - start) // width * width):
        worst = max(worst, float(np.max(np.abs(toy.logits(seq[:i + 1], width) - toy.logits(seq[:i + 1], 1)))))
    return worst


def test_a_planted_kernel_switch_shows_in_the_drift_at_its_width_only(toy):
    with Session() as s:
        r = ref.run_check(s, backend="toy-widths", target=f"dispatch:{WIDE}:{EPS}", settings=EngineSettings(threads=2),
                          prompts=[("a", PROMPT)], continuation=11, widths=[1, 2, 3, 4, 11])
    assert r["kind"] == "threads" and r["ok"] is True, r["problems"]
    seq = PROMPT + FakeEngine(KernelToy(f"dispatch:{WIDE}:{EPS}").toy).model.greedy(PROMPT, 10)
    # 10 positions: whole passes of 1, 2, 3 and 4 tokens cover 10, 10, 9 and 8 of them; none is 11 wide
    assert [w["width"] for w in r["widths"]] == [1, 2, 3, 4]
    for w, n in zip(r["widths"], (10, 10, 9, 8)):
        assert w["pair"]["positions"] == n and w["pair"]["max_logit_delta"] == 0.0 and w["pair"]["same_top1"] == 1.0
        want = _toy_drift(seq, len(PROMPT), w["width"])
        assert w["drift"]["max_logit_delta"] == pytest.approx(want, rel=1e-5, abs=1e-7)
        assert (want > 0) == (w["width"] >= WIDE)
        assert w["reference_drift"]["max_logit_delta"] == pytest.approx(want, rel=1e-5, abs=1e-7)
    # the drift is the envelope the near-tie band is calibrated from
    assert ties.width_drift(r) == pytest.approx(max(_toy_drift(seq, len(PROMPT), w) for w in (2, 3, 4)), rel=1e-5)
    text = ref.format_check(r)
    assert "per verify width" in text and text.count("\n") > 8


def test_a_broken_build_is_broken_at_every_width(toy):
    with Session() as s:
        r = ref.run_check(s, backend="broken-cpu-w", target="0", settings=EngineSettings(threads=2),
                          prompts=[("a", PROMPT)], continuation=9, widths=[1, 2, 3])
    assert r["ok"] is False
    for w in r["widths"]:
        assert w["pair"]["same_top1"] < ref.TOP1_LIMIT and w["pair"]["kl_mean"] > ref.KL_MEAN_LIMIT
        assert any(p.startswith(f"at width {w['width']}:") for p in r["problems"])


def test_widths_are_checked_up_front(toy):
    from specview.commands.check import parse_widths
    from specview.core.errors import SpecviewError

    assert parse_widths("1-4") == [1, 2, 3, 4] and parse_widths("8,1,2-3") == [1, 2, 3, 8] and parse_widths("none") == []
    for bad in ("0-3", "4-2", "x", "1,,2"):
        with pytest.raises(SpecviewError, match="--widths"):
            parse_widths(bad)
    with Session() as s, pytest.raises(SpecviewError, match="batch"):
        ref.run_check(s, backend="toy-widths", target=f"dispatch:{WIDE}:{EPS}",
                      settings=EngineSettings(threads=2, n_batch=4, n_ubatch=4), prompts=[("a", PROMPT)],
                      continuation=6, widths=[8])


# -- real llama.cpp ------------------------------------------------------------------------------
def _forced(ctx: Any, seq: list[int], start: int, width: int) -> np.ndarray:
    """Rows start.. of seq in whole passes of ``width`` after a one-pass prefill, read without specview's check."""
    ctx.reset()
    ctx.eval(seq[:start], rows=[start - 1])
    return np.concatenate([ctx.eval(seq[a:a + width], rows=range(width))
                           for a in range(start, start + (len(seq) - start) // width * width, width)])


def test_the_cpu_against_itself_and_against_two_threads_on_a_tiny_gguf(tiny_target, capsys):
    import door
    from specview.core.diagnose.reference import Pair

    # two threads are the costly side (a pass waits for both): widths 1 and 3 of a short continuation
    rc = cli.main(["check", "-m", str(tiny_target), "-p", "the cat sat on the", "--no-chat", "-n", "6", "-t", "2",
                   "--widths", "1,3", "--json", "-q"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["ok"] is True and [w["width"] for w in r["widths"]] == [1, 3], r
    m = door.model(tiny_target)
    one, two = door.context(m, threads=1, n_ctx=256), door.context(m, threads=2, n_ctx=256)
    toks = m.tokenize("the cat sat on the", chat=False)
    start = len(toks)
    # the continuation the reference side chose, greedily (one thread, one token per pass)
    seq = list(toks)
    one.reset()
    row = one.eval(seq, rows=[len(seq) - 1])[0]
    for _ in range(5):
        seq.append(int(np.argmax(row)))
        row = one.eval([seq[-1]], rows=[0])[0]
    t1 = _forced(two, seq, start, 1)
    for w in r["widths"]:
        rw, tw = _forced(one, seq, start, w["width"]), _forced(two, seq, start, w["width"])
        assert w["pair"]["positions"] == len(rw) == {1: 5, 3: 3}[w["width"]] and len(seq) - start == 5
        assert w["pair"]["max_logit_delta"] == pytest.approx(float(np.max(np.abs(rw - tw))), rel=1e-4, abs=1e-9)
        assert w["drift"]["max_logit_delta"] == pytest.approx(float(np.max(np.abs(tw - t1[:len(tw)]))), rel=1e-4,
                                                              abs=1e-9)
        assert w["pair"]["same_top1"] == float(np.mean(np.argmax(rw, 1) == np.argmax(tw, 1)))
    # the same setup on both sides: llama.cpp's CPU is deterministic, so every figure is exactly zero
    s1 = door.settings(threads=1)
    with Session() as s:
        same = ref.run_check(s, backend="llama.cpp", target=str(tiny_target), settings=s1,
                             prompts=[("p", toks)], continuation=9, widths=[1, 2, 3, 4],
                             pair=Pair("same", s1, s1, "1 thread", "1 thread"))
    for w in same["widths"]:
        assert (w["pair"]["kl_max"], w["pair"]["max_logit_delta"], w["pair"]["same_top1"]) == (0.0, 0.0, 1.0)


def test_a_diagnosis_checks_the_widths_its_run_verified(toy):
    from specview.core import diagnose as dmod
    from specview.core.session import RunConfig

    cfg = RunConfig(backend="toy-widths", target=f"dispatch:{WIDE}:{EPS}", draft="dispatch:99:0",
                    prompt="the cat sat on the mat", chat=False, max_tokens=24, ignore_eos=True, n_max=3,
                    engine=EngineSettings(threads=2))
    with Session() as s:
        trace = s.run(cfg)
        d = dmod.diagnose(s, s.resolve(cfg).config, trace, reference=True, serial_verify=False)
    widest = max(r.batch_size for r in trace.speculative.rounds if r.index > 0)
    r = d["reference"]
    assert [w["width"] for w in r["widths"]] == list(range(1, widest + 1))
    n = len(trace.vanilla.tokens) - 1
    assert all(w["pair"]["positions"] == n // w["width"] * w["width"] for w in r["widths"])
    t = ties.tie_density(trace)
    if trace.comparison.identical:  # no replay envelope: the band comes from the width drift
        assert "width drift" in t["envelope"]["source"]
        assert t["envelope"]["max"] == pytest.approx(ties.width_drift(r))
    else:
        assert "replay envelope" in t["envelope"]["source"]
