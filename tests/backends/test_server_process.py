"""No local server outlives specview: killed parent, failed start, port in use, a server dying mid-request.

These use a small stand-in server (a Python script speaking HTTP on the port it
is given) so they run everywhere, fast; the same guarantees against the real
llama-server are in test_server.py.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specview.backends.local_server import process as lp
from specview.backends.local_server.process import Cancelled, ServerError
from specview.backends.llama_server.process import LlamaServer

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")

STANDIN = textwrap.dedent('''
    import http.server, json, os, signal, sys, time
    args = sys.argv[1:]
    if os.environ.get("STANDIN_TERM_FILE"):  # say that a SIGTERM (a graceful stop, not a kill) reached it
        def on_term(signum, frame):
            with open(os.environ["STANDIN_TERM_FILE"], "w") as f:
                f.write("SIGTERM")
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "exit":
        print("llama_model_load: error loading model: tensor data is not within the file bounds", flush=True)
        sys.exit(1)

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if mode == "die":
                os._exit(3)
            if mode == "slow":
                time.sleep(60)
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(3):
                    self.wfile.write(b"data: " + json.dumps({"n": i}).encode() + b"\\n\\n")
                    self.wfile.flush()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"echo": body}).encode())

    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    print(f"listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    srv.serve_forever()
''')


@pytest.fixture()
def standin(tmp_path) -> list[str]:
    p = tmp_path / "standin.py"
    p.write_text(STANDIN)
    return [sys.executable, str(p)]


class Standin(LlamaServer):
    """The stand-in with llama-server's port announcement and exit causes."""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


def test_a_server_answers_json_and_streams_and_stops(standin):
    s = Standin(standin, [], label="t")
    with s:
        s.wait_ready(timeout=30)
        assert s.port > 0 and s.alive()
        assert s.post("/completion", {"a": 1}) == {"echo": {"a": 1}}
        assert [ev["n"] for ev in s.stream("/completion", {"stream": True})] == [0, 1, 2]
        pid = s.pid
    assert not s.alive() and _wait_gone(pid)
    assert s not in lp.live_servers()


def test_a_server_that_exits_at_start_is_named_with_its_output(standin):
    s = Standin(standin, [], label="vanilla", env=dict(os.environ, STANDIN_MODE="exit"))
    s.start()
    with pytest.raises(ServerError) as ei:
        s.wait_ready(timeout=30)
    msg = str(ei.value)
    assert "exited while starting with status 1" in msg and "could not load the model" in msg
    assert "tensor data is not within the file bounds" in msg
    s.stop()
    assert _wait_gone(s.pid)


def test_a_port_in_use_is_refused_before_anything_starts(standin):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        s = Standin(standin, [], label="vanilla", port=port)
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            s.start()
        assert s.proc is None


def test_a_server_dying_mid_request_is_named_and_gone(standin):
    s = Standin(standin, [], label="speculative", env=dict(os.environ, STANDIN_MODE="die"))
    s.start()
    try:
        s.wait_ready(timeout=30)
        with pytest.raises(ServerError, match=r"llama-server \(speculative, pid \d+\) exited during a request "
                                              r"with status 3"):
            s.post("/completion", {"x": 1})
    finally:
        s.stop()
    assert _wait_gone(s.pid)


def test_cancel_during_a_request_stops_the_server(standin):
    s = Standin(standin, [], label="vanilla", env=dict(os.environ, STANDIN_MODE="slow"))
    s.start()
    s.wait_ready(timeout=30)
    t0 = time.monotonic()
    deadline = t0 + 0.3
    with pytest.raises(Cancelled):
        s.post("/completion", {"x": 1}, cancel=lambda: time.monotonic() > deadline)
    assert _wait_gone(s.pid) and not s.alive()


def test_a_failed_start_among_several_stops_the_others(standin):
    ok = Standin(standin, [], label="vanilla")
    bad = Standin(standin, [], label="speculative", env=dict(os.environ, STANDIN_MODE="exit"))
    with pytest.raises(ServerError):
        lp.start_all([ok, bad], timeout=30)
    assert _wait_gone(ok.pid) and _wait_gone(bad.pid)


def test_a_sigkilled_parent_takes_its_server_with_it(standin, tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''
        import sys, time
        from specview.backends.llama_server.process import LlamaServer
        s = LlamaServer({standin!r}, [], label="orphan")
        s.start()
        s.wait_ready(timeout=30)
        print("READY", s.pid, s.port, flush=True)
        time.sleep(300)
    '''))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"READY (\d+) (\d+)", line)
        assert m, line
        pid, port = int(m.group(1)), int(m.group(2))
        assert not _gone(pid)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert _wait_gone(pid), "the server outlived its SIGKILLed parent"
    with socket.socket() as sock:  # and its port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_sigterm_to_specview_stops_its_servers_first(standin, tmp_path):
    """specview's own handler stops the server (it gets SIGTERM), before the kernel's death signal would kill it."""
    marker = tmp_path / "term"
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''
        import os, time
        os.environ["STANDIN_TERM_FILE"] = {str(marker)!r}
        from specview.backends.llama_server.process import LlamaServer
        s = LlamaServer({standin!r}, [], label="term")
        s.start()
        s.wait_ready(timeout=30)
        print("READY", s.pid, flush=True)
        time.sleep(300)
    '''))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        m = re.match(r"READY (\d+)", p.stdout.readline())
        assert m
        pid = int(m.group(1))
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert _wait_gone(pid)
    assert marker.is_file() and marker.read_text() == "SIGTERM", "the server was killed, not stopped by specview"
