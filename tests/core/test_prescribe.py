"""The prescription on toy engines with planted kernel switches: its lossless claims must hold when both arms run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import FakeEngine
from specview.core.config import EngineSettings, RunConfig
from specview.core.kernels.map import kernel_map
from specview.core.matrix.prescribe import Prescription, prescribe, suite_rates, wilson
from specview.core.registry import register_backend, unregister_backend
from specview.core.inprocess import InProcessBackend
from specview.core.session import Session
from test_kernels import PROMPTS, ToyLoaded

POSITIONS = 24


class UbatchEngine(FakeEngine):
    """Honours n_ubatch as llama.cpp does: a pass wider than the micro-batch is computed in micro-batches."""

    def __init__(self, *a, ubatch: int, **k):
        super().__init__(*a, **k)
        self.ubatch = ubatch

    def eval(self, tokens, rows):
        n = len(tokens)
        self.kv.extend(tokens)
        out = []
        for r in rows:
            r = r + n if r < 0 else r
            width = min(n, self.ubatch) if self.ubatch < n else n
            out.append(self.model.logits(self.kv[: self.n_past + r + 1], width))
        self.n_past += n
        self.n_evals += 1
        return np.stack(out)


class UbLoaded(ToyLoaded):
    def new_engine(self, settings: EngineSettings, n_ctx: int):
        if self.kind == "noisy":
            return super().new_engine(settings, n_ctx)
        return UbatchEngine(self.toy, n_ctx=n_ctx, n_batch=settings.n_batch, ubatch=settings.n_ubatch)


class UbBackend(InProcessBackend):
    name = "prescribe-toy"

    def load(self, name, settings):
        return UbLoaded(name)


@pytest.fixture()
def session():
    register_backend("prescribe-toy", UbBackend)
    with Session() as s:
        yield s
    unregister_backend("prescribe-toy")


def arms_identical(session: Session, claim_target: str, draft: str, n_max: int, settings: EngineSettings,
                   prompt_tokens, max_tokens: int) -> bool:
    cfg = RunConfig(target=claim_target, draft=draft, n_max=n_max, backend="prescribe-toy", engine=settings,
                    prompt_tokens=tuple(prompt_tokens), prompt=None, chat=False, max_tokens=max_tokens,
                    ignore_eos=True)
    return session.run(cfg, reuse_vanilla=False).comparison.identical


def check_claims(session: Session, pres: Prescription, km, draft: str) -> int:
    """Every proven claim: both arms identical on every prompt it names, over the positions it names."""
    checked = 0
    for c in pres.lossless:
        assert c.proven
        m = c.measurement
        for p in km.prompts:
            assert f"{p.name} tokens 1-{km.positions}" in c.evidence
            assert arms_identical(session, m.target, draft, c.n_max, m.settings, p.tokens, km.positions)
            checked += 1
    return checked


def test_largest_safe_n_max_is_claimed_and_holds(session):
    target = "dispatch:5:1.0"
    km = kernel_map(session, [target], PROMPTS, widths=range(1, 9), positions=POSITIONS, backend="prescribe-toy")
    pres = prescribe(session, km, draft="dispatch:99:0", candidates=[1, 2, 3, 4, 6], max_tokens=POSITIONS)
    claims = {(c.kind, c.n_max) for c in pres.lossless}
    assert ("n_max", 3) in claims
    assert all(c.n_max <= 3 for c in pres.lossless if c.kind == "n_max")
    assert check_claims(session, pres, km, "dispatch:99:0") >= len(PROMPTS)
    assert not any(c.contradicted for c in pres.lossless)
    # the fastest setting measured beyond n_max 3 is lossy here, and -ub 1 was mapped for it
    text = pres.text()
    assert "--spec-draft-n-max 3" in text and "proven by the kernel map" in text
    assert pres.fastest_lossy is None or pres.fastest_lossy.n_max > 3 or pres.fastest_lossy.settings.n_ubatch == 1


def test_nothing_lossless_says_so_and_forces_it_with_ub1(session):
    target = "dispatch:2:1.0"  # every verify width differs
    km = kernel_map(session, [target], PROMPTS, widths=range(1, 5), positions=POSITIONS, backend="prescribe-toy")
    pres = prescribe(session, km, draft="dispatch:99:0", candidates=[1, 3], max_tokens=POSITIONS)
    assert [c.kind for c in pres.lossless] == ["ub1"]
    assert pres.lossless[0].measurement.settings.n_ubatch == 1
    assert any("no n_max is lossless" in s and "-ub 1" in s for s in pres.nothing)
    assert check_claims(session, pres, km, "dispatch:99:0") == len(PROMPTS)
    # and the lossy settings really are lossy somewhere: the map's flips are not for show
    assert pres.fastest_lossy is not None and pres.fastest_lossy.settings.n_ubatch != 1
    assert "-ub 1" in pres.text() and "Fastest lossy setting" in pres.text()


def test_nondeterministic_backend_gets_no_claim(session):
    km = kernel_map(session, ["noisy"], PROMPTS[:1], widths=range(1, 4), positions=8, backend="prescribe-toy")
    pres = prescribe(session, km, draft="noisy", candidates=[1, 2], max_tokens=8, ub1=False)
    assert pres.lossless == []
    assert any("not deterministic" in s for s in pres.nothing)
    assert "none." in pres.text()


def test_suite_results_are_read_tolerantly(session, tmp_path):
    target = "dispatch:2:1.0"
    km = kernel_map(session, [target], PROMPTS, widths=range(1, 5), positions=8, backend="prescribe-toy")
    pres0 = prescribe(session, km, draft="dispatch:99:0", candidates=[3], max_tokens=8, ub1=False)
    n = pres0.fastest_lossy.n_max
    shapes = [
        {"rates": [{"setting": {"target": target, "n_max": n}, "divergence_rate": 0.25, "diverged": 10, "n": 40,
                    "interval": [0.14, 0.4]}]},
        {"rates": {"by_setting": [{"params": {"target": target, "n_max": n, "drafter": "dispatch:99:0"},
                                   "rate": {"value": 0.25, "low": 0.14, "high": 0.4}, "k": 10, "n": 40}]}},
        {"cells": [{"params": {"target": target, "n_max": n}, "identical": i >= 10} for i in range(40)]},
    ]
    for i, doc in enumerate(shapes):
        p = tmp_path / f"suite{i}.json"
        p.write_text(json.dumps(doc))
        rates = suite_rates(str(p))
        assert rates and rates[0]["rate"] == pytest.approx(0.25)
        pres = prescribe(session, km, draft="dispatch:99:0", candidates=[3], max_tokens=8, ub1=False,
                         suite_results=str(p))
        assert pres.lossy_rate.startswith("divergence rate 25% (10 of 40 prompts), 95% interval 14-40%")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rates": [{"target": "elsewhere", "n_max": n, "rate": 0.5}]}))
    pres = prescribe(session, km, draft="dispatch:99:0", candidates=[3], max_tokens=8, ub1=False,
                     suite_results=str(other))
    assert "no entry for this setting" in pres.lossy_rate


def test_wilson_interval():
    from specview.core.matrix.rates import wilson as rates_wilson

    assert wilson is rates_wilson  # one interval for the prescription and the matrix's rates
    lo, hi = wilson(10, 40)
    # z = 1.959964 (Z95), not the rounded 1.96 the prescription once used: the bounds move in the 6th decimal
    assert lo == pytest.approx(0.1418712, abs=1e-6) and hi == pytest.approx(0.4019396, abs=1e-6)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def test_claim_settings_are_the_mapped_ones(session):
    km = kernel_map(session, ["dispatch:5:1.0"], PROMPTS, widths=range(1, 6), positions=8,
                    settings=EngineSettings(flash_attn="on"), backend="prescribe-toy")
    pres = prescribe(session, km, draft="dispatch:99:0", candidates=[3], max_tokens=8)
    c = next(c for c in pres.lossless if c.kind == "n_max")
    assert c.measurement.settings == km.targets[0].settings  # as the map recorded them: decided for this machine
    assert c.measurement.settings.flash_attn == "on"
    assert "-fa on" in pres.text()
