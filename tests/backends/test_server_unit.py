"""The llama-server engine's logic without a real server: parsing, rounds, errors, the trace's nulls."""

from __future__ import annotations

import math
import stat
from pathlib import Path

import pytest

from specview.backends.llama_server import binary as sb
from specview.backends.llama_server.protocol import (Chunk, StreamResult, arm_from_response, arm_from_stream,
                                                     completion_body, held_back_ids, rebuild_rounds,
                                                     reads_request_speculation)
from specview.backends.local_server.openai import TokenLogprob, parse_logprobs
from specview.backends.local_server.process import ServerError
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import ConfigError, SpecviewError
from specview.core.registry import get_backend
from specview.core.trace import Trace

HELP = """----- common params -----
-m,    --model FNAME                    model path
--spec-type none,draft-simple,draft-eagle3,draft-mtp,ngram-simple,ngram-mod
                                        comma-separated list of types of speculative decoding to use
--cache-ram, -cram N                    prompt cache size
"""


def test_spec_types_are_parsed_from_the_help_line():
    assert sb.parse_spec_types(HELP) == ["none", "draft-simple", "draft-eagle3", "draft-mtp", "ngram-simple",
                                         "ngram-mod"]
    assert sb.parse_spec_types("-m, --model FNAME\n--draft N  old flag\n") == []


def test_the_backend_is_registered_and_out_of_process():
    be = get_backend("llama-server")
    assert be.name == "llama-server" and be.in_process is False and be.model_kind == "gguf"
    r = be.runner()
    try:
        assert r.loads == 0 and r.vanilla_runs == 0 and r.speculative_runs == 0
    finally:
        r.close()


def _entry(tok, top):
    return {"id": tok, "token": "x", "bytes": [120], "logprob": top[0][1] if top else 0.0,
            "top_logprobs": [{"id": i, "token": "x", "bytes": [120], "logprob": lp} for i, lp in top]}


def test_arm_from_response_keeps_what_the_server_gave_and_nulls_the_rest():
    resp = {
        "tokens": [5, 6, 7],
        "stop_type": "limit",
        "completion_probabilities": [
            _entry(5, [(5, -0.1), (9, -2.6), (3, -4.0)]),
            _entry(6, []),  # a token emitted by the speculative verify step: no top-k
            _entry(7, [(7, -0.5), (6, -0.75)]),
        ],
        "timings": {"prompt_ms": 12.5, "predicted_ms": 300.0, "draft_n": 4, "draft_n_accepted": 2},
    }
    arm = arm_from_response("speculative", resp, prompt_len=10, piece=lambda t: f"<{t}>")
    assert arm.tokens == [5, 6, 7] and arm.text == "<5><6><7>"
    assert [s.pos for s in arm.steps] == [10, 11, 12]
    assert math.isclose(arm.steps[0].margin, 2.5) and arm.steps[0].top_ids == [5, 9, 3]
    assert arm.steps[1].margin is None and arm.steps[1].top_ids == []
    assert math.isclose(arm.steps[2].margin, 0.25)
    assert all(s.round is None and s.from_draft is None and s.batch_size is None for s in arm.steps)
    assert arm.stop_reason == "max_tokens" and arm.eval_ms is None
    assert math.isclose(arm.tokens_per_s, 10.0)


def test_a_token_left_out_of_the_probabilities_gets_none_and_its_neighbours_keep_theirs():
    resp = {"tokens": [10, 200, 201, 11], "stop_type": "limit",
            "completion_probabilities": [_entry(10, [(10, -0.1), (3, -1.1)]), _entry(201, [(201, -0.2), (4, -0.7)]),
                                         _entry(11, [(11, -0.3), (5, -3.3)])]}
    arm = arm_from_response("vanilla", resp, prompt_len=0, piece=str)
    assert [s.top_ids[:1] for s in arm.steps] == [[10], [], [201], [11]]
    assert [round(s.margin, 3) for s in arm.steps if s.margin is not None] == [1.0, 0.5, 3.0]


# -- rounds from streamed counters -----------------------------------------------------------
def _stream(counters, tokens, *, probs_at=()):
    """Chunks for tokens 1..n with (predicted_ms, draft_n, draft_n_accepted) per token."""
    return [Chunk(n=i + 1, token=t, entry=_entry(t, [(t, -0.1), (t + 1, -0.4)]) if i in probs_at else None,
                  predicted_ms=c[0], draft_n=c[1], draft_n_accepted=c[2])
            for i, (t, c) in enumerate(zip(tokens, counters))]


def test_rounds_are_rebuilt_from_cumulative_counters_and_add_up():
    # token 0 from the prompt; a verify step drafting 3 accepting 2 (3 tokens); a step with no draft;
    # a verify step drafting 2 accepting 0; a last step cut short by an accepted end-of-text draft token
    # (drafted 4, accepted 3, 2 emitted: both drafts, as the in-process loop counts them)
    counters = [(0.001, 0, 0), (5.0, 3, 2), (5.0, 3, 2), (5.0, 3, 2), (7.0, 3, 2), (9.5, 5, 2), (12.0, 9, 5),
                (12.0, 9, 5)]
    chunks = _stream(counters, [10, 11, 12, 13, 14, 15, 16, 17], probs_at=(0, 4))
    rr = rebuild_rounds(chunks, 8, prefill_chunk=7)
    assert rr.reason is None
    assert [(r.index, r.drafted, r.accepted, r.batch_size, r.first_step) for r in rr.rounds] == [
        (0, 0, 0, 7, 0), (1, 3, 2, 4, 1), (2, 0, 0, 1, 4), (3, 2, 0, 3, 5), (4, 4, 2, 5, 6)]
    assert rr.step_rounds == [(0, False, 7, 6), (1, True, 4, 0), (1, True, 4, 1), (1, False, 4, 2), (2, False, 1, 0),
                              (3, False, 3, 0), (4, True, 5, 0), (4, True, 5, 1)]
    assert rr.step_ms == [None, 4.999, 2.0, 2.5, 2.5]
    # the arm the stream makes: every token's round, and draft_ms/verify_ms left null
    sr = StreamResult(chunks=chunks, final={"tokens_predicted": 8, "stop_type": "limit",
                                             "timings": {"prompt_ms": 3.0, "predicted_ms": 12.0}})
    arm, _ = arm_from_stream("speculative", sr, prompt_len=7, n_batch=512, piece=str)
    assert arm.tokens == [10, 11, 12, 13, 14, 15, 16, 17]
    assert [s.round for s in arm.steps] == [0, 1, 1, 1, 2, 3, 4, 4]
    # every token is the prompt's, an accepted draft, or one step's own: they add up
    assert 1 + sum(r.accepted for r in arm.rounds) + sum(1 for r in arm.rounds[1:] if r.first_step + r.accepted < len(arm.tokens)) == len(arm.tokens)
    assert all(r.draft_ms is None and r.verify_ms is None and r.draft_tokens == [] for r in arm.rounds)
    assert arm.steps[0].top_ids and not arm.steps[1].top_ids


def test_a_token_held_back_inside_a_character_still_adds_up_or_says_why():
    counters = [(0.001, 0, 0), (5.0, 3, 2), (5.0, 3, 2), (5.0, 3, 2), (7.0, 3, 2)]
    chunks = _stream(counters, [10, 11, 12, 13, 14])
    inner = [c for c in chunks if c.n != 3]  # token 2 was not streamed; its step is known from its neighbours
    rr = rebuild_rounds(inner, 5, prefill_chunk=4)
    assert rr.reason is None and [r.accepted for r in rr.rounds] == [0, 2, 0]
    gone = [c for c in chunks if c.n != 5]  # the last one-token step vanished with its token: nothing says where
    rr = rebuild_rounds(gone, 5, prefill_chunk=4)
    assert rr.rounds is None and "incomplete UTF-8" in rr.reason
    sr = StreamResult(chunks=inner, final={"tokens_predicted": 5})
    with pytest.raises(ServerError, match="left tokens out"):
        arm_from_stream("speculative", sr, prompt_len=3, n_batch=512, piece=str)
    arm, rr = arm_from_stream("speculative", sr, prompt_len=3, n_batch=512, piece=str, tokens=[10, 11, 99, 13, 14])
    assert arm.tokens == [10, 11, 99, 13, 14] and rr.rounds is not None


def test_without_per_token_timings_the_rounds_are_null_with_the_reason():
    chunks = [Chunk(n=i + 1, token=t, entry=None, predicted_ms=None, draft_n=0, draft_n_accepted=0)
              for i, t in enumerate([1, 2, 3])]
    rr = rebuild_rounds(chunks, 3, prefill_chunk=1)
    assert rr.rounds is None and "timings_per_token" in rr.reason


def test_requests_ask_for_greedy_tokens_and_per_token_timings_when_streamed():
    b = completion_body([1, 2], 5, n_probs=8, stream=True, speculative={"n_max": 4, "p_min": 0.5})
    assert b["temperature"] == 0.0 and b["top_k"] == 1 and b["return_tokens"] and b["timings_per_token"]
    assert b["speculative.n_max"] == 4 and b["speculative.p_min"] == 0.5 and b["cache_prompt"] is False
    assert not reads_request_speculation({"generation_settings": {"speculative.types": "draft-simple"}})
    assert reads_request_speculation({"generation_settings": {"speculative.n_max": 4, "speculative.n_min": 0,
                                                              "speculative.p_min": 0.5}})


def test_openai_logprobs_in_both_shapes_come_back_sorted():
    chat = {"logprobs": {"content": [{"id": 7, "token": "a", "logprob": -0.2,
                                      "top_logprobs": [{"id": 9, "token": "b", "logprob": -1.9},
                                                       {"id": 7, "token": "a", "logprob": -0.2}]}]}}
    (t,) = parse_logprobs(chat)
    assert t == TokenLogprob(7, "a", -0.2, [7, 9], ["a", "b"], [-0.2, -1.9]) and math.isclose(t.margin, 1.7)
    legacy = {"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.3],
                           "top_logprobs": [{"b": -2.0, "a": -0.1}, {"b": -0.3}]}}
    ts = parse_logprobs(legacy)
    assert [x.top_texts for x in ts] == [["a", "b"], ["b"]] and ts[1].margin is None
    assert parse_logprobs({"logprobs": None}) == []


# -- bad input -----------------------------------------------------------------------------------
def test_missing_directory_and_non_executable_binaries_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv(sb.ENV_BIN, raising=False)
    with pytest.raises(ServerError, match="does not exist"):
        sb.find_server_bin(str(tmp_path / "nope" / "llama-server"))
    with pytest.raises(ServerError, match="is a directory"):
        sb.find_server_bin(str(tmp_path))
    f = tmp_path / "llama-server"
    f.write_text("#!/bin/sh\n")
    f.chmod(0o644)
    with pytest.raises(ServerError, match="not executable"):
        sb.find_server_bin(str(f))
    monkeypatch.setenv(sb.ENV_BIN, str(tmp_path / "gone"))
    with pytest.raises(ServerError, match=r"\$SPECVIEW_LLAMA_SERVER"):
        sb.find_server_bin()


def test_a_program_that_is_not_llama_server_is_refused():
    with pytest.raises(ServerError, match="does not look like llama-server"):
        sb.server_info("/bin/false")


def _fake_server(tmp_path: Path) -> str:
    p = tmp_path / "fake-llama-server"
    p.write_text("""#!/bin/sh
case "$1" in
  --version) echo "version: 1 (fake)"; echo "built with cc"; exit 0;;
  --list-devices) echo "Available devices:"; exit 0;;
  --help) echo "--spec-type none,draft-simple,ngram-simple"; exit 0;;
esac
exit 1
""")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def _cfg(spec_type: str, server_bin: str, **kw) -> RunConfig:
    return RunConfig(target="demo:Q8_0", draft=kw.pop("draft", None), spec_type=spec_type, prompt_tokens=(1, 2, 3),
                     backend="llama-server", engine=EngineSettings(server_bin=server_bin, **kw))


def test_the_check_refuses_what_the_binary_does_not_offer_before_starting_anything(tmp_path):
    fake = _fake_server(tmp_path)
    be = get_backend("llama-server")
    assert be.spec_types(EngineSettings(server_bin=fake)) == ["none", "draft-simple", "ngram-simple"]
    with pytest.raises(ConfigError, match="draft-mtp is not offered by this llama-server; it offers none, "
                                          "draft-simple, ngram-simple") as ei:
        be.check(_cfg("draft-mtp", fake))
    assert ei.value.setting == "spec_type"
    with pytest.raises(ConfigError, match="server_args must not contain --port"):
        be.check(_cfg("ngram-simple", fake, server_args="--port 9"))
    with pytest.raises(ServerError, match="/bin/false does not look like llama-server"):
        be.check(_cfg("ngram-simple", "/bin/false"))
    be.check(_cfg("ngram-simple", fake))  # fine


def test_a_trace_with_server_nulls_and_rounds_survives_save_and_load(tmp_path):
    from specview.core.arms.compare import compare_arms

    counters = [(0.001, 0, 0), (5.0, 3, 2), (5.0, 3, 2), (5.0, 3, 2)]
    sr = StreamResult(chunks=_stream(counters, [1, 2, 3, 4]), final={"tokens_predicted": 4, "stop_type": "limit",
                                                                      "timings": {"predicted_ms": 5.0}})
    s, _ = arm_from_stream("speculative", sr, prompt_len=3, n_batch=512, piece=str)
    s.reported_drafted, s.reported_accepted = 3, 2
    v = arm_from_response("vanilla", {"tokens": [1, 2, 3, 5], "stop_type": "limit",
                                      "completion_probabilities": [_entry(t, [(t, -0.1), (0, -1.1)])
                                                                   for t in (1, 2, 3, 5)]}, prompt_len=3, piece=str)
    t = Trace(config={}, environment={"engine": "llama-server"}, models={"target": {}, "draft": None},
              prompt={"tokens": [0, 1, 2]}, vanilla=v, speculative=s, comparison=compare_arms(v, s))
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert back.speculative.n_drafted == 3 and back.speculative.n_accepted == 2
    assert [(r.drafted, r.accepted, r.draft_ms, r.verify_ms) for r in back.speculative.rounds] == [
        (0, 0, None, None), (3, 2, None, None)]
    assert [st.from_draft for st in back.speculative.steps] == [False, True, True, False]
    assert back.vanilla.eval_ms is None and back.comparison.first_mismatch.index == 3
    Trace.load(back.save(tmp_path / "again.json"))  # and it saves again
    with pytest.raises(SpecviewError):
        raise SpecviewError("x")


def test_held_back_ids_ask_again_unstreamed_only_when_the_stream_left_a_token_out():
    class Server:
        def __init__(self):
            self.posts: list[tuple[str, dict]] = []

        def post(self, path, body, cancel=None):
            self.posts.append((path, body))
            return {"tokens": [10, 11, 12, 13]}

    chunks = _stream([(0.001, 0, 0), (5.0, 3, 2), (5.0, 3, 2), (7.0, 3, 2)], [10, 11, 12, 13])
    body = completion_body([1, 2, 3], 4, n_probs=2, stream=True)
    srv = Server()
    assert held_back_ids(srv, StreamResult(chunks=chunks, final={"tokens_predicted": 4}), body) is None
    assert srv.posts == []  # every token streamed: no second request
    inner = [c for c in chunks if c.n != 2]
    assert held_back_ids(srv, StreamResult(chunks=inner, final={"tokens_predicted": 4}), body) == [10, 11, 12, 13]
    [(path, sent)] = srv.posts
    assert path == "/completion" and sent["stream"] is False and sent["timings_per_token"] is False
    assert sent["prompt"] == body["prompt"] and sent["n_predict"] == 4
