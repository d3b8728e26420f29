"""The independent check on the tiny hybrids: specview's in-process draft-simple arms against llama-server's.

llama-server (the setup's build, ``$SPECVIEW_LLAMA_SERVER``, the same llama.cpp as the in-process engine)
rolls a hybrid target back by checkpoint and replay for draft-simple: it saves the recurrent state before
each verify pass and, on partial acceptance, restores it and verifies the accepted tokens and its own again.
specview's in-process loop does the same, and here its arms must equal the server's token for token on both
tiny hybrids (Qwen3.5 and LFM2, each with its Q4_0 copy as the drafter), and the server's streamed counters
must rebuild into rounds that replay as the in-process rounds do.  Both runs must really have rolled back by
checkpoint and replay: the in-process arm's ``rollbacks`` record counts its target's and its draft model's
checkpoint restores and replays, and llama-server, run at ``-lv 5`` (debug), logs each checkpoint it saves and restores
(``server-context.cpp``: "created speculative checkpoint", "restoring speculative checkpoint").  What the server
does not show: its draft context's own rollback (it restores the draft state from the same checkpoint after
every draft, ``load_dft``, and logs nothing for it), and which tokens a replay fed.  Required in CI with
``SPECVIEW_REQUIRE_SERVER=1`` (``tests/require.py``); without a server these tests skip.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyhybrid import hybrid_pair  # noqa: E402

from specview.backends.llama_server import ServerRunner  # noqa: E402
from specview.backends.llama_server.protocol import Chunk, rebuild_rounds  # noqa: E402
from specview.core.session import Session  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402

from test_server import find_binary  # noqa: E402

pytestmark = [pytest.mark.slow]

ARCHS = ("qwen35", "lfm2")
#: where the compared runs are looked for; the first two of each target whose plain decoding meets no
#: end-of-generation token are used: llama-server's ignore_eos bans those tokens (a -inf logit bias), while
#: specview's in-process arms pick one and go on, so past one the two engines decode different texts
PROMPTS = ("the cat and the dog", "history of the essay", "the students sleep", "greedy speculative decoding",
           "a bicycle on the fork", "a model of the target")
PER_ARCH = 2
N = 64
#: llama-server's debug verbosity: it logs every speculative checkpoint it saves and restores
VERBOSE = "-lv 5"
SAVED, RESTORED = "created speculative checkpoint", "restoring speculative checkpoint"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid-server")
    return {arch: hybrid_pair(arch, d) for arch in ARCHS}


@pytest.fixture(scope="module")
def both(pairs):
    """{arch: [(in-process trace, llama-server trace), ...]}, each pair on the same settings and prompt."""
    binary = find_binary()
    out: dict[str, list] = {}
    session = Session()
    try:
        with ServerRunner() as runner:
            for arch in ARCHS:
                target, draft = pairs[arch]
                out[arch] = []
                for prompt in PROMPTS:
                    cfg = RunConfig(target=str(target), draft=str(draft), prompt=prompt, chat=False, max_tokens=N,
                                    ignore_eos=True, n_max=3, engine=EngineSettings(threads=1, n_ctx=512))
                    local = session.run(cfg)
                    eog = session.model(cfg.backend, cfg.target, session.resolve(cfg).settings).vocab.eog
                    if eog & set(local.vanilla.tokens):
                        continue
                    before = log_ends(runner)
                    served = runner.run(replace(cfg, backend="llama-server", prompt=None,
                                                prompt_tokens=tuple(local.prompt["tokens"]),
                                                engine=replace(cfg.engine, server_bin=binary, server_args=VERBOSE)))
                    served.extra["test_server_log"] = server_log_counts(runner, before)
                    out[arch].append((local, served))
                    if len(out[arch]) == PER_ARCH:
                        break
                assert len(out[arch]) == PER_ARCH, f"{arch}: fewer than {PER_ARCH} prompts decode no end token"
    finally:
        session.close()
    return out


def log_ends(runner) -> dict[str, int]:
    """Where each live server's log file ends now."""
    return {str(srv.log_path): Path(srv.log_path).stat().st_size for srv in runner.pool.live() if srv.log_path}


def server_log_counts(runner, before: dict[str, int]) -> dict[str, int]:
    """How many speculative checkpoints the live servers logged saving and restoring since ``before``."""
    counts = {SAVED: 0, RESTORED: 0}
    for srv in runner.pool.live():
        assert srv.log_path, "the server's output is not in a log file"
        with open(srv.log_path, "rb") as fh:
            fh.seek(before.get(str(srv.log_path), 0))
            text = fh.read().decode("utf-8", "replace")
        for key in counts:
            counts[key] += text.count(key)
    return counts


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", range(PER_ARCH))
def test_in_process_draft_simple_arms_equal_llama_servers_token_for_token(both, arch, k):
    local, served = both[arch][k]
    # the premise: plain decoding of the same file is the same on both engines
    assert served.vanilla.tokens == local.vanilla.tokens
    assert len(served.speculative.tokens) == len(local.speculative.tokens) == N
    assert served.speculative.tokens == local.speculative.tokens
    # both rolled back: the drafter was accepted in part, and the in-process arm replayed as the server does
    s = local.speculative
    assert local.config["context_used"]["rollback"] == "checkpoint"
    assert 0 < s.n_accepted < s.n_drafted and any(r.replay for r in s.rounds)
    # the same loop: the same drafts, the same acceptances, the same rounds replayed (a difference here is the
    # two engines drafting or rolling back differently, whatever the texts)
    v = served.speculative
    assert (v.n_drafted, v.n_accepted) == (s.n_drafted, s.n_accepted)
    assert sum(1 for r in v.rounds if r.replay) == sum(1 for r in s.rounds if r.replay)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", range(PER_ARCH))
def test_both_runs_rolled_back_by_checkpoint_and_replay(both, arch, k):
    local, served = both[arch][k]
    s, v = local.speculative, served.speculative
    replayed = sum(1 for r in s.rounds if r.replay)
    # in process: every replayed round restored the target's checkpoint and fed its tokens again (a replay that
    # rejects a carried token restores and replays once more), and never an n_rs_seq snapshot or a state copy
    target = s.rollbacks["target"]
    assert target["checkpoint"] == target["replay"] >= replayed > 0
    assert target["n_rs_seq"] == target["state-copy"] == 0
    # the draft model (a recurrent state too) rolled back its drafted tokens by its own checkpoints
    assert s.rollbacks["draft"]["checkpoint"] > 0 and s.rollbacks["draft"]["n_rs_seq"] == 0
    # llama-server: a checkpoint saved before every verify pass that drafted, one restored for every replay
    logged = served.extra["test_server_log"]
    assert logged[SAVED] >= sum(1 for r in v.rounds[1:] if r.drafted) > 0
    assert logged[RESTORED] >= sum(1 for r in v.rounds if r.replay) > 0
    assert logged[RESTORED] == target["checkpoint"]  # the same loop restores as often


@pytest.mark.parametrize("arch", ARCHS)
def test_the_servers_rounds_rebuild_with_its_replays(both, arch):
    """The server's streamed counters say which steps replayed after a checkpoint restore (they emit
    accepted + 2 tokens); rebuilt, they add up to the server's own totals and every token."""
    for _, served in both[arch]:
        s = served.speculative
        rounds = served.extra["server"]["speculative"]["rounds"]
        assert rounds["available"], rounds
        assert sum(r.drafted for r in s.rounds) == s.reported_drafted
        assert sum(r.accepted for r in s.rounds) == s.reported_accepted
        assert 1 + sum(r.emitted for r in s.rounds[1:]) == len(s.tokens)
        replayed = [r for r in s.rounds if r.replay]
        assert replayed and all(r.rollback == "checkpoint" and r.replay == r.accepted + 2 for r in replayed)
        assert all(st.batch_size == s.rounds[st.round].replay for st in s.steps if s.rounds[st.round].replay)


def test_a_replayed_step_is_read_from_synthetic_counters():
    # token 0; a step drafting 3 accepting 1 that replayed (3 tokens: the draft, the target's, the next);
    # a plain step drafting 2 accepting 2 (3 tokens)
    counters = [(0.001, 0, 0), (4.0, 3, 1), (4.0, 3, 1), (4.0, 3, 1), (6.0, 5, 3), (6.0, 5, 3), (6.0, 5, 3)]
    chunks = [Chunk(n=i + 1, token=10 + i, entry=None, predicted_ms=ms, draft_n=d, draft_n_accepted=a)
              for i, (ms, d, a) in enumerate(counters)]
    rr = rebuild_rounds(chunks, len(chunks), prefill_chunk=5)
    assert rr.reason is None
    assert [(r.drafted, r.accepted, r.batch_size, r.first_step, r.rollback, r.replay) for r in rr.rounds[1:]] == [
        (3, 1, 4, 1, "checkpoint", 3), (2, 2, 3, 4, "", 0)]
    assert rr.step_rounds[1:4] == [(1, True, 3, 0), (1, False, 3, 1), (1, False, 3, 2)]
