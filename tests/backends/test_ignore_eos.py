"""``--ignore-eos`` as llama.cpp defines it, on a tiny hybrid pair whose target puts EOS on top.

llama.cpp: "ignore end of stream token and continue generating (implies --logit-bias EOS-inf)". Every
end-of-generation token is banned, never emitted.  The pair is made so that EOS comes top where the plain
model would pick one token X: the target's output row of EOS is 1.5 times X's, and nothing else changes.
So with EOS banned the target decodes exactly what the plain model decodes unbanned, an independent
reference; unbanned it stops at the first X.  Its drafter (a Q4_0 copy) has EOS on top at the same places
and drafts it, as llama.cpp's draft sampler (no logit bias) does; the banned target rejects it there.

Checked: the in-process vanilla, speculative (checkpoint and snapshot rollback) and serial-verify arms
against that reference and against a plain llama-cpp-python greedy loop with the EOG tokens banned; the
diagnosis replays reproduce both arms; llama-server's arms equal the in-process ones token for token.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import door  # noqa: E402
from tinyhybrid import PAIRS, WRITERS  # noqa: E402

from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.session import Session  # noqa: E402

pytest.importorskip("llama_cpp")

EOS = 2  # the tests' SPM vocabulary: </s>
ARCHS = ("qwen35", "lfm2")
PROMPT = "the cat"
N = 48
SCALE = 1.5


def plain_greedy(path: Path, prompt: list[int], n: int, *, ban: frozenset[int] = frozenset()
                 ) -> tuple[list[int], list[int]]:
    """``n`` greedy tokens of llama-cpp-python's own ``Llama`` (one token per eval), the ``ban`` ids at -inf;
    and the indices where a banned id was the row's top-1."""
    llm = door.llama(path, n_ctx=256, n_batch=64, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        llm.eval(prompt)
        out, top_banned = [], []
        for j in range(n):
            # the last (only) output row of the eval: Llama keeps no scores unless it computes every row's
            row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)
            if int(np.argmax(row)) in ban:
                top_banned.append(j)
            row[list(ban)] = -np.inf
            out.append(int(np.argmax(row)))
            llm.eval([out[-1]])
        return out, top_banned
    finally:
        llm.close()


def write_eos_like(writer, path: Path, like: int, **kw) -> Path:
    """``writer``'s model with the output row of EOS set to ``SCALE`` times token ``like``'s."""
    import gguf

    add = gguf.GGUFWriter.add_tensor

    def add_tensor(self, name, tensor, *a, **k):
        if name == "output.weight":
            tensor = tensor.copy()
            tensor[EOS] = SCALE * tensor[like]
        return add(self, name, tensor, *a, **k)

    with mock.patch.object(gguf.GGUFWriter, "add_tensor", add_tensor):
        return writer(path, **kw)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{arch: (target, drafter, prompt ids, reference tokens, indices where EOS is the target's top-1)}."""
    from specview.backends.llama_cpp.quantize import quantize

    d = tmp_path_factory.mktemp("ignore-eos")
    out = {}
    for arch in ARCHS:
        kw = dict(PAIRS[arch], seed=11)
        plain = WRITERS[arch](d / f"{arch}-plain.gguf", **kw)
        ids = door.model(plain, vocab_only=True).tokenize(PROMPT, chat=False)
        ref, _ = plain_greedy(plain, ids, N)
        like = Counter(t for t in ref[4:] if t >= 131).most_common(1)[0][0]  # a word the walk keeps coming to
        target = write_eos_like(WRITERS[arch], d / f"{arch}-eos.gguf", like, **kw)
        draft = quantize(target, d / f"{arch}-eos.Q4_0.gguf", "Q4_0", threads=1)
        eog = door.model(target, vocab_only=True).vocab.eog
        banned, tops = plain_greedy(target, ids, N, ban=eog)
        out[arch] = (target, draft, ids, ref, banned, tops, eog)
    return out


def cfg_for(target, draft, **kw) -> RunConfig:
    engine = kw.pop("engine", EngineSettings(threads=1, n_ctx=256))
    return RunConfig(target=str(target), draft=str(draft), prompt=PROMPT, chat=False, max_tokens=N, ignore_eos=True,
                     n_max=3, engine=engine, **kw)


@pytest.fixture(scope="module")
def local(pairs):
    """{(arch, rollback, serial): trace} of the in-process engine."""
    session = Session()
    out = {}
    try:
        for arch in ARCHS:
            target, draft = pairs[arch][:2]
            for rollback, serial in (("checkpoint", False), ("snapshots", False), ("checkpoint", True)):
                cfg = cfg_for(target, draft, serial_verify=serial,
                              engine=EngineSettings(threads=1, n_ctx=256, rollback=rollback))
                out[arch, rollback, serial] = session.run(cfg)
        yield out
    finally:
        session.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_pair_puts_eos_on_top_and_the_banned_walk_is_the_plain_models(pairs, arch):
    _, _, _, ref, banned, tops, eog = pairs[arch]
    assert EOS in eog
    assert len(tops) >= 2, "EOS must come top more than once for the test to mean anything"
    assert banned == ref  # only the EOS row changed, and EOS is never picked: the plain model's walk
    assert not eog & set(banned)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("rollback,serial", [("checkpoint", False), ("snapshots", False), ("checkpoint", True)])
def test_in_process_arms_ban_every_end_of_generation_token(pairs, local, arch, rollback, serial):
    _, _, _, ref, banned, tops, eog = pairs[arch]
    t = local[arch, rollback, serial]
    assert t.vanilla.tokens == banned and t.speculative.tokens == banned
    assert t.vanilla.stop_reason == t.speculative.stop_reason == "max_tokens"
    # the recorded top-k are the candidates the ban leaves: the emitted token heads each, EOS is in none
    for st in t.vanilla.steps + t.speculative.steps:
        assert st.top_ids[0] == st.token and not eog & set(st.top_ids)
    s = t.speculative
    assert all(r.serial is serial for r in s.rounds[1:])
    assert t.config["context_used"]["rollback"] == rollback
    # the drafter has EOS on top where the target does and drafts it; the banned target rejects it there
    drafted_eos = [r for r in s.rounds if EOS in r.draft_tokens]
    assert drafted_eos and all(r.accepted <= r.draft_tokens.index(EOS) for r in drafted_eos)
    assert 0 < s.n_accepted < s.n_drafted
    if rollback == "checkpoint" and not serial:
        assert any(r.replay for r in s.rounds)


@pytest.mark.parametrize("arch", ["qwen35"])
def test_the_diagnosis_replays_reproduce_both_banned_arms(pairs, local, arch):
    target, draft = pairs[arch][:2]
    t = local[arch, "checkpoint", False]
    from specview.core.diagnose import diagnose

    session = Session()
    try:
        cfg = session.resolve(cfg_for(target, draft, engine=EngineSettings(threads=1, n_ctx=256,
                                                                            rollback="checkpoint"))).config
        diag = diagnose(session, cfg, t, envelope_if_identical=True)
    finally:
        session.close()
    rp = diag["replays"]
    assert rp["positions"] == N
    assert rp["single"]["reproduced"] and rp["speculative"]["reproduced"], rp


@pytest.fixture(scope="module")
def served(pairs, local):
    from test_server import find_binary

    from specview.backends.llama_server import ServerRunner

    binary = find_binary()
    out = {}
    with ServerRunner() as runner:
        for arch in ARCHS:
            target, draft = pairs[arch][:2]
            lt = local[arch, "checkpoint", False]
            cfg = cfg_for(target, draft)
            out[arch] = runner.run(replace(cfg, backend="llama-server", prompt=None,
                                           prompt_tokens=tuple(lt.prompt["tokens"]),
                                           engine=replace(cfg.engine, server_bin=binary)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_server_bans_as_the_in_process_arms_do_token_for_token(pairs, local, served, arch):
    _, _, _, _, banned, tops, eog = pairs[arch]
    lt, st = local[arch, "checkpoint", False], served[arch]
    assert st.vanilla.tokens == lt.vanilla.tokens == banned
    assert st.speculative.tokens == lt.speculative.tokens == banned
    assert st.vanilla.stop_reason == "max_tokens"
    # where EOS was the row's top-1 the server reported it first; the trace keeps the candidates the ban left
    for s in st.vanilla.steps:
        assert not eog & set(s.top_ids) and (not s.top_ids or s.top_ids[0] == s.token)
    # the same loop: the same drafts and acceptances, the drafted EOS rejected by both
    v, s = st.speculative, lt.speculative
    assert (v.n_drafted, v.n_accepted) == (s.n_drafted, s.n_accepted)


def test_locate_walks_the_continuation_as_an_ignore_eos_run_does(pairs):
    from specview.core.locate.find import locate

    target, _, ids, _, banned, tops, _ = pairs["qwen35"]
    position = tops[0] + 2  # past the first place EOS comes top
    session = Session()
    try:
        kw = dict(target=str(target), width=2, row=1, position=position, prompt_tokens=ids,
                  settings=EngineSettings(threads=1))
        loc = locate(session, ignore_eos=True, **kw)
        plain = locate(session, **kw)
    finally:
        session.close()
    assert loc.single_tokens == [banned[position - 1]] and loc.batch_tokens == banned[position - 2:position]
    assert EOS in plain.batch_tokens + plain.single_tokens  # unbanned, the walk emits EOS there and goes on
