"""The llama-server engine's logic without a real server: parsing, flags, errors, the trace's nulls."""

from __future__ import annotations

import math
import os
import time
import socket
import stat
from pathlib import Path

import pytest

from specview.backends import server as srv
from specview.core.engine import SpecviewError
from specview.core.trace import Trace

HELP = """----- common params -----
-m,    --model FNAME                    model path
--spec-type none,draft-simple,draft-eagle3,draft-mtp,ngram-simple,ngram-mod
                                        comma-separated list of types of speculative decoding to use
--cache-ram, -cram N                    prompt cache size
"""


def test_spec_types_are_parsed_from_the_help_line():
    assert srv.parse_spec_types(HELP) == ["none", "draft-simple", "draft-eagle3", "draft-mtp", "ngram-simple",
                                          "ngram-mod"]
    assert srv.parse_spec_types("-m, --model FNAME\n--draft N  old flag\n") == []


def test_server_args_split_between_both_servers_and_the_speculative_one():
    both, spec = srv.split_server_args('--temp 0 -ngld 99 --spec-ngram-mod-n-match 24 --no-mmap '
                                       '--override-kv "a=int:1" --spec-draft-p-split -0.5')
    assert both == ["--temp", "0", "--no-mmap", "--override-kv", "a=int:1"]
    assert spec == ["-ngld", "99", "--spec-ngram-mod-n-match", "24", "--spec-draft-p-split", "-0.5"]
    for bad in ("--port 8080", "--host=0.0.0.0", "-m x.gguf", "--spec-type draft-mtp", "-md d.gguf"):
        with pytest.raises(SpecviewError, match=bad.split()[0].split("=")[0]):
            srv.split_server_args(bad)
    with pytest.raises(SpecviewError, match="cannot split"):
        srv.split_server_args('--override-kv "unclosed')


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
    arm = srv.arm_from_response("speculative", resp, prompt_len=10, piece=lambda t: f"<{t}>")
    assert arm.tokens == [5, 6, 7]
    assert arm.text == "<5><6><7>"
    assert [s.pos for s in arm.steps] == [10, 11, 12]
    assert math.isclose(arm.steps[0].margin, 2.5)
    assert arm.steps[0].top_ids == [5, 9, 3]
    assert arm.steps[1].margin is None and arm.steps[1].top_ids == []
    assert math.isclose(arm.steps[2].margin, 0.25)
    assert all(s.round is None and s.from_draft is None and s.batch_size is None for s in arm.steps)
    assert arm.stop_reason == "max_tokens" and arm.eval_ms is None
    assert math.isclose(arm.tokens_per_s, 10.0)


def test_a_trace_with_server_nulls_and_reported_totals_survives_save_and_load(tmp_path):
    from specview.core.compare import compare_arms
    from specview.core.trace import ArmResult

    v = srv.arm_from_response("vanilla", {"tokens": [1, 2], "stop_type": "limit",
                                          "completion_probabilities": [_entry(1, [(1, -0.1), (2, -1.1)]),
                                                                       _entry(2, [(2, -0.2), (1, -0.3)])]},
                              prompt_len=3, piece=str)
    s = srv.arm_from_response("speculative", {"tokens": [1, 3], "stop_type": "limit",
                                              "completion_probabilities": [_entry(1, [(1, -0.1), (2, -1.1)]),
                                                                           _entry(3, [])]},
                              prompt_len=3, piece=str)
    s.reported_drafted, s.reported_accepted = 5, 3
    t = Trace(config={}, environment={"engine": "llama-server"}, models={"target": {}, "draft": None},
              prompt={"tokens": [0, 1, 2]}, vanilla=v, speculative=s, comparison=compare_arms(v, s))
    p = t.save(tmp_path / "t.json")
    back = Trace.load(p)
    assert back.speculative.n_drafted == 5 and back.speculative.n_accepted == 3
    assert math.isclose(back.speculative.acceptance_rate, 0.6)
    assert back.speculative.steps[1].margin is None and back.speculative.steps[1].round is None
    assert back.vanilla.eval_ms is None
    assert back.comparison.first_mismatch.index == 1
    # the in-process shape is untouched: totals come from the rounds there
    assert ArmResult(name="speculative").n_drafted == 0


def test_missing_directory_and_non_executable_binaries_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv(srv.ENV_BIN, raising=False)
    with pytest.raises(srv.ServerError, match="does not exist"):
        srv.find_server_bin(str(tmp_path / "nope" / "llama-server"))
    with pytest.raises(srv.ServerError, match="is a directory"):
        srv.find_server_bin(str(tmp_path))
    f = tmp_path / "llama-server"
    f.write_text("#!/bin/sh\n")
    f.chmod(0o644)
    with pytest.raises(srv.ServerError, match="not executable"):
        srv.find_server_bin(str(f))
    monkeypatch.setenv(srv.ENV_BIN, str(tmp_path / "gone"))
    with pytest.raises(srv.ServerError, match=r"\$SPECVIEW_LLAMA_SERVER"):
        srv.find_server_bin()


def test_a_program_that_is_not_llama_server_is_refused():
    with pytest.raises(srv.ServerError, match="does not look like llama-server"):
        srv.server_info("/bin/false")


def _fake_server(tmp_path: Path, start_behaviour: str) -> str:
    """A script that answers --version/--help/--list-devices like llama-server and then does ``start_behaviour``."""
    p = tmp_path / "fake-llama-server"
    p.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo "version: 1 (fake)"; echo "built with cc"; exit 0;;
  --list-devices) echo "Available devices:"; exit 0;;
  --help) echo "--spec-type none,draft-simple,ngram-simple"; exit 0;;
esac
{start_behaviour}
""")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_a_server_that_exits_at_start_is_a_clear_error_quoting_its_output(tmp_path):
    fake = _fake_server(tmp_path, 'echo "llama_model_load: error loading model: tensor data is not within the file bounds" >&2\nexit 1')
    s = srv.LlamaServer(fake, ["-m", "x.gguf"], label="vanilla")
    s.start()
    with pytest.raises(srv.ServerError) as ei:
        s.wait_ready(timeout=20)
    msg = str(ei.value)
    assert "exited while starting with status 1" in msg
    assert "could not load the model" in msg
    assert "tensor data is not within the file bounds" in msg
    assert not s.alive()
    s.stop()


def test_a_port_already_taken_is_named_before_anything_starts(tmp_path):
    fake = _fake_server(tmp_path, "exit 0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        s = srv.LlamaServer(fake, [], label="vanilla", port=port)
        with pytest.raises(srv.ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            s.start()
        assert s.proc is None


def _gone_or_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_stop_kills_the_whole_process_group(tmp_path):
    # the "server" ignores SIGTERM and has a child: stop() must still leave nothing behind
    fifo = tmp_path / "child.pid"
    os.mkfifo(fifo)
    fake = _fake_server(tmp_path, f"trap '' TERM\nsleep 300 &\necho $! > '{fifo}'\nwait")
    s = srv.LlamaServer(fake, [], label="vanilla")
    s.start()
    try:
        with open(fifo) as fh:  # blocks until the script has started its child
            child = int(fh.read().strip())
        assert not _gone_or_zombie(child)
    finally:
        s.stop(grace=0.5)
    assert not s.alive() and s.returncode is not None
    # SIGKILL is delivered asynchronously: give the kernel a bounded moment to finish the child
    deadline = time.monotonic() + 5.0
    while not _gone_or_zombie(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone_or_zombie(child)


def test_run_server_trace_refuses_a_program_that_is_not_llama_server_before_starting_anything():
    from specview.core.session import RunConfig

    cfg = RunConfig(target="demo:Q8_0", draft=None, spec_type="ngram-simple", prompt_tokens=(1, 2, 3),
                    backend="llama-server")
    with pytest.raises(srv.ServerError, match="/bin/false does not look like llama-server"):
        srv.run_server_trace(cfg, server_bin="/bin/false")


def test_a_spec_type_the_binary_does_not_offer_is_refused_with_the_ones_it_does(tmp_path):
    from specview.core.session import RunConfig

    fake = _fake_server(tmp_path, "exit 1")
    cfg = RunConfig(target="demo:Q8_0", draft=None, spec_type="draft-mtp", prompt_tokens=(1, 2, 3),
                    backend="llama-server")
    with pytest.raises(SpecviewError, match="draft-mtp is not offered by this llama-server; it offers none, "
                                            "draft-simple, ngram-simple"):
        srv.run_server_trace(cfg, server_bin=fake)


def test_a_token_left_out_of_the_probabilities_gets_none_and_its_neighbours_keep_theirs():
    # llama-server omits the entry of a token whose text is an incomplete UTF-8 sequence
    resp = {"tokens": [10, 200, 201, 11], "stop_type": "limit",
            "completion_probabilities": [_entry(10, [(10, -0.1), (3, -1.1)]), _entry(201, [(201, -0.2), (4, -0.7)]),
                                         _entry(11, [(11, -0.3), (5, -3.3)])]}
    arm = srv.arm_from_response("vanilla", resp, prompt_len=0, piece=str)
    assert [s.top_ids[:1] for s in arm.steps] == [[10], [], [201], [11]]
    assert arm.steps[1].margin is None
    assert [round(s.margin, 3) for s in arm.steps if s.margin is not None] == [1.0, 0.5, 3.0]
