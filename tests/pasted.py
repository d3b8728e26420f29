"""Running what a report tells a user to paste: its shell blocks, a free port for each server it starts, and the
wait until those servers answer (the issue reproductions' tests, for llama-server and mlx_lm.server alike)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from typing import Iterable, Sequence

from markdown_it import MarkdownIt

from specview.backends.local_server.process import pdeathsig_preexec


def sh_blocks(body: str) -> list[str]:
    """The contents of the Markdown's ```sh fences, in order."""
    return [t.content for t in MarkdownIt("commonmark").parse(body) if t.type == "fence" and t.info == "sh"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(procs: Sequence[subprocess.Popen], ports: Iterable[str | int], *, what: str,
                 seconds: float = 180.0, poll: float = 0.3) -> None:
    """Until every port's ``/health`` answers 200; fails the test if one of ``procs`` exits or ``seconds`` pass."""
    t0 = time.monotonic()
    for port in ports:
        while True:
            assert all(p.poll() is None for p in procs), f"a {what} of the report exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() - t0 < seconds, "the report's servers did not come up"
            time.sleep(poll)


def start_server(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """One of the report's servers, started as specview starts its own: in a process group of its own and killed by
    the kernel when this process dies, so a lane that is killed mid-test leaves no server behind."""
    return subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=pdeathsig_preexec())


def stop_servers(procs: Sequence[subprocess.Popen]) -> None:
    """Terminate the servers, and kill any that has not exited 20 s later."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
