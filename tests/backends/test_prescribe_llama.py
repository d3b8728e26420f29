"""The prescription on real llama.cpp engines: every setting it calls lossless gives identical arms on its prompts.

Which settings are lossless depends on this CPU's kernels; the tests assert only that
whatever the prescription claims holds when both arms run, over the prompts and
positions the claim names.
"""

from __future__ import annotations

from specview.core.config import EngineSettings, RunConfig
from specview.core.kernels.map import kernel_map
from specview.core.matrix.prescribe import prescribe
from specview.core.session import Session


def check_claims(session: Session, km, pres, draft: str) -> int:
    checked = 0
    for c in pres.lossless:
        m = c.measurement
        assert c.proven and not c.contradicted
        for p in km.prompts:
            assert f"{p.name} tokens 1-{km.positions}" in c.evidence
            cfg = RunConfig(target=m.target, draft=draft, n_max=c.n_max, engine=m.settings, prompt=p.text,
                            chat=p.chat, max_tokens=km.positions, ignore_eos=True)
            trace = session.run(cfg, reuse_vanilla=False)
            assert trace.comparison.identical, (c.to_json(), p.name, trace.comparison.first_mismatch)
            assert len(trace.speculative.tokens) == km.positions
            assert max(r.batch_size for r in trace.speculative.rounds[1:]) <= c.n_max + 1
            checked += 1
    return checked


def test_tiny_model_claims_hold(tiny_target, tiny_draft):
    st = EngineSettings(threads=1)
    with Session() as s:
        km = kernel_map(s, [str(tiny_target)], ["the cat is on the", "a dog and a bicycle"], widths=range(1, 5),
                        positions=12, settings=st)
        pres = prescribe(s, km, draft=str(tiny_draft), candidates=[1, 3], max_tokens=12)
        # on a deterministic backend something is always provable: a safe n_max, or -ub 1 where none is
        assert pres.lossless
        assert check_claims(s, km, pres, str(tiny_draft)) >= 2


def test_demo_claims_hold(demo_paths):
    with Session() as s:
        km = kernel_map(s, [str(demo_paths["Q4_K_M"])], ["Write an essay on the importance of sleep for students."],
                        widths=range(1, 5), positions=16, settings=EngineSettings(threads=1))
        pres = prescribe(s, km, draft=str(demo_paths["Q4_0"]), candidates=[3], max_tokens=16)
        assert pres.lossless
        assert check_claims(s, km, pres, str(demo_paths["Q4_0"])) >= 1
        assert "proven by the kernel map" in pres.text()
