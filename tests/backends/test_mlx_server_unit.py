"""The mlx-server engine's pieces that need no server: requests, answers, flags, the program."""

from __future__ import annotations

import os
import stat
import sys

import pytest
from require import require_module

from specview.backends.local_server.process import ServerError
from specview.backends.mlx_server import protocol
from specview.backends.mlx_server.process import (ENV_BIN, MLXServer, find_server_program, kv_flags, server_args,
                                                  split_server_args)
from specview.core.errors import ConfigError


def top(*pairs):
    return [{"id": i, "token": f"t{i}", "logprob": lp} for i, lp in pairs]


def answer(entries, n=None, finish="length"):
    return ({"finish_reason": finish, "logprobs": {"content": entries}},
            {"usage": {"prompt_tokens": 5, "completion_tokens": len(entries) if n is None else n}})


def test_the_emitted_token_is_the_best_of_the_unsorted_top_list():
    # mlx_lm.server puts the list's first member in the entry's own id/logprob, whatever its rank
    e0 = top((7, -2.5), (3, -0.25), (9, -4.0))
    e1 = top((4, -1.0), (2, -1.0), (5, -3.0))  # a tie: greedy's argmax takes the lower id
    entries = [dict(e0[0], top_logprobs=e0), dict(e1[0], top_logprobs=e1)]
    choice, resp = answer(entries, finish="stop")
    arm = protocol.arm_from_answer("vanilla", choice, resp, prompt_len=5, piece=lambda t: f"<{t}>", top_k=2)
    assert arm.tokens == [3, 2]
    s0, s1 = arm.steps
    assert (s0.top_ids, s0.top_logits, s0.margin) == ([3, 7], [-0.25, -2.5], 2.25)
    assert (s1.top_ids, s1.margin) == ([2, 4], 0.0)
    assert (s0.pos, s1.pos, s1.index) == (5, 6, 1)
    assert arm.text == "<3><2>" and arm.stop_reason == "eos"
    assert s0.round is None and s0.from_draft is None and s0.batch_size is None and s0.batch_index is None
    assert arm.eval_ms is None and arm.rounds == [] and arm.reported_drafted is None


def test_without_a_top_list_the_entry_id_is_the_token():
    choice, resp = answer([{"id": 11, "logprob": -0.5}, {"id": 12, "logprob": -0.1}])
    arm = protocol.arm_from_answer("vanilla", choice, resp, prompt_len=0, piece=str, top_k=8)
    assert arm.tokens == [11, 12] and arm.steps[0].top_ids == [] and arm.steps[0].margin is None


def test_a_count_that_does_not_add_up_is_refused():
    choice, resp = answer([{"id": 1, "logprob": -0.5}], n=2)
    with pytest.raises(ServerError, match="2 completion tokens but 1 logprobs entries"):
        protocol.arm_from_answer("speculative", choice, resp, prompt_len=0, piece=str, top_k=8)


def test_requests_are_greedy_with_boolean_logprobs():
    path, body = protocol.arm_request("hi", chat=False, max_tokens=7, top_logprobs=8, num_draft_tokens=3)
    assert path == "/v1/completions" and body["prompt"] == "hi"
    assert body["logprobs"] is True and body["top_logprobs"] == 8 and body["num_draft_tokens"] == 3
    assert body["temperature"] == 0.0 and isinstance(body["seed"], int) and body["max_tokens"] == 7
    path, body = protocol.arm_request("hi", chat=True, max_tokens=7, top_logprobs=8)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert "num_draft_tokens" not in body and body["logprobs"] is True


class _Refusing:
    def __init__(self, message):
        self.message = message

    def post(self, path, body, **kw):
        if self.message is None:
            return {"choices": [{}]}
        raise ServerError(self.message)


def test_the_top_logprob_cap_is_read_from_the_servers_refusal():
    cap, words = protocol.probe_top_logprobs_cap(_Refusing(
        "mlx_lm.server (vanilla) refused POST /v1/completions with HTTP 400: top_logprobs must be at most 11"))
    assert (cap, words) == (11, "top_logprobs must be at most 11")
    assert protocol.probe_top_logprobs_cap(_Refusing(None))[0] is None
    with pytest.raises(ServerError, match="HTTP 500"):
        protocol.probe_top_logprobs_cap(_Refusing("refused with HTTP 500: boom"))


def test_every_null_field_has_its_reason():
    assert all(isinstance(v, str) and len(v) > 20 for v in protocol.NOT_REPORTED.values())
    assert any("from_draft" in k for k in protocol.NOT_REPORTED) and "prompt_ms" in protocol.NOT_REPORTED


def test_flags():
    assert split_server_args("--trust-remote-code --chat-template-args '{\"a\": 1}'") == [
        "--trust-remote-code", "--chat-template-args", '{"a": 1}']
    for flag in ("--port 1", "--host=0.0.0.0", "--draft-model x", "--prompt-cache-size 3", "--kv-bits 4"):
        with pytest.raises(ConfigError) as err:
            split_server_args(flag)
        assert err.value.setting == "server_args" and flag.split()[0].split("=")[0] in str(err.value)
    with pytest.raises(ConfigError, match="cannot split"):
        split_server_args("--x 'unclosed")
    assert kv_flags("f16", 64) == [] and kv_flags("q8_0", 32) == ["--kv-bits", "8", "--kv-group-size", "32",
                                                                   "--quantized-kv-start", "0"]
    with pytest.raises(ConfigError) as err:
        kv_flags("iq4_nl", 64)
    assert err.value.setting == "kv_type"
    args = server_args("/m", draft="/d", n_batch=128, kv=["--kv-bits", "4"], extra=["--x"])
    assert args == ["--model", "/m", "--draft-model", "/d", "--prompt-cache-size", "0", "--prefill-step-size",
                    "128", "--kv-bits", "4", "--x"]
    srv = MLXServer(["prog"], args, label="t", port=1234)
    assert srv.command()[-4:] == ["--host", "127.0.0.1", "--port", "1234"]
    assert srv.env["HF_HUB_OFFLINE"] == "1"
    assert srv.fatal_cause("OSError: [Errno 98] Address already in use") == "its port 1234 on 127.0.0.1 is already in use"
    assert "generation thread died" in srv.fatal_cause("ERROR - mlx_lm.server generation thread died: x")
    assert srv.fatal_cause("INFO - Starting httpd") is None


def test_the_program(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_BIN, raising=False)
    py = tmp_path / "python3.12"
    py.write_text("#!/bin/sh\n")
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    assert find_server_program(str(py)) == [str(py), "-m", "mlx_lm", "server"]
    prog = tmp_path / "mlx_lm.server"
    prog.write_text("#!/bin/sh\n")
    with pytest.raises(ServerError, match="not executable"):
        find_server_program(str(prog))
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ENV_BIN, str(prog))
    assert find_server_program() == [str(prog)]
    assert find_server_program(str(py))[0] == str(py)  # --server-bin wins over the environment
    with pytest.raises(ServerError, match=r"nowhere/mlx_lm.server \(from --server-bin\) does not exist"):
        find_server_program("/nowhere/mlx_lm.server")
    monkeypatch.delenv(ENV_BIN)
    found = find_server_program()
    assert found[0] == os.path.join(os.path.dirname(sys.executable), "mlx_lm.server") or found[-2:] == [
        "mlx_lm", "server"] or found[0].endswith("mlx_lm.server")


def test_the_desktop_app_never_runs_itself_as_a_python(tmp_path, monkeypatch):
    """The frozen app's executable is the app: ``-m mlx_lm server`` would start a second window, not a server."""
    monkeypatch.delenv(ENV_BIN, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no mlx_lm.server on it
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "specview"))
    with pytest.raises(ServerError, match=r"no mlx_lm.server found on PATH.*--server-bin"):
        find_server_program()
    prog = tmp_path / "mlx_lm.server"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    assert find_server_program() == [str(prog)]  # the one beside the app's executable, or on PATH


def test_the_backend_is_registered_and_describes_itself():
    require_module("mlx.core")
    require_module("mlx_lm")
    from specview.core.registry import backend_names, get_backend

    assert "mlx-server" in backend_names()
    be = get_backend("mlx-server")
    assert (be.name, be.model_kind, be.in_process) == ("mlx-server", "folder", False)
    assert be.spec_types() == ["none", "draft-simple"]
    assert be.label == "mlx_lm.server"


def test_doctor_names_the_program_or_says_what_to_do():
    require_module("mlx.core")
    require_module("mlx_lm")
    from specview.core.config import EngineSettings
    from specview.core.registry import get_backend

    be = get_backend("mlx-server")
    found = be.setup_facts(EngineSettings())
    assert [f.name for f in found] == ["program", "in_process"] and found[0].status == "ok"
    missing = be.setup_facts(EngineSettings(server_bin="/nowhere/mlx_lm.server"))
    assert missing[0].value is None and "does not exist" in missing[0].text and missing[0].advice
