"""The linked HTML file of a run in a real headless Chromium (Debian's ``chromium``), driven over the DevTools
protocol on a pipe: it opens with no console error and no request beyond itself, shows the verdict and the
fork card, and a real click on a token in one arm (or a hover on a plot) selects the same token in the other
arm and moves every plot's cursor to it.

The run is the fake backend's, whose rows of passes wider than one token carry a planted error, so the
speculative arm forks at a near-tie; its token pieces (``<7>``) are markup-like text the page must escape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeBackend
from specview.core import diagnose as dmod
from specview.core.registry import register_backend
from specview.core.report.linked import linked_html
from specview.core.session import RunConfig, Session

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")


class Browser:
    """Chromium with ``--remote-debugging-pipe``: requests on fd 3, replies and events on fd 4, NUL-separated."""

    def __init__(self, profile: Path):
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends at 3 and 4, as Chromium expects them
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "--window-size=1200,1600", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # 3 and 4 are kept open past the child's closing of other descriptors, which runs after fds()
            preexec_fn=fds, pass_fds=(3, 4), start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._from_r, 65536)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0,
             browser: bool = False) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def js(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True, timeout=5)
        except Exception:  # noqa: BLE001 - it may already be gone; it is stopped below either way
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    register_backend("fake", FakeBackend)
    tmp = tmp_path_factory.mktemp("linked")
    with Session() as s:
        for prompt in ("one two three", "four five", "six seven eight nine", "ten eleven"):
            cfg = RunConfig(backend="fake", target="0:0:0.5", draft="0:1.0", prompt=prompt, max_tokens=60,
                            ignore_eos=True, n_max=4)
            trace = s.run(cfg)
            if not trace.comparison.identical:
                break
        assert not trace.comparison.identical, "the planted error forks one of these prompts"
        dmod.diagnose(s, s.resolve(cfg).config, trace)
    path = tmp / "run-linked.html"
    path.write_text(linked_html(trace), encoding="utf-8")
    b = Browser(tmp / "profile")
    try:
        target = b.call("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        b.session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            b.call(f"{domain}.enable")
        b.call("Page.navigate", {"url": path.as_uri()})
        b.wait_event("Page.loadEventFired")
        yield b, trace, path
    finally:
        b.close()


def _centre(b: Browser, selector: str) -> tuple[float, float]:
    r = b.js(f"(function(){{var e=document.querySelector('{selector}'); e.scrollIntoView({{block:'center'}});"
             "var r=e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];})()")
    return r[0], r[1]


def test_it_opens_with_the_verdict_and_the_fork_card(page):
    b, trace, _ = page
    fork = trace.comparison.first_mismatch.index
    assert b.js("document.getElementById('verdict').textContent").startswith(trace.diagnosis["verdict"].upper())
    card = b.js("document.getElementById('fork-card').innerText")
    assert f"Fork card: token {fork}" in card and "near-tie density" in card
    # the fork token is marked in both arms, and selected at first (with every plot's cursor on it)
    assert b.js(f"document.querySelectorAll('.tk.fork[data-i=\"{fork}\"]').length") == 2
    assert b.js("Array.from(document.querySelectorAll('.tk.sel')).map(e => +e.dataset.i)") == [fork, fork]
    # token pieces such as "<7>" are shown as text, never parsed as markup
    piece = trace.vanilla.steps[0].piece
    assert b.js("document.querySelector('#arm-vanilla .tk[data-i=\"0\"]').textContent") == piece
    assert b.js("document.querySelectorAll('#arm-vanilla *').length") == 1 + len(trace.vanilla.steps)


def _cursor_x(b: Browser, plot: str) -> float:
    return float(b.js(f"document.querySelector('#{plot} .cursor').getAttribute('x1')"))


def _hit_x(b: Browser, plot: str, i: int) -> float:
    return float(b.js(f"(function(){{var h=document.querySelector('#{plot} .hit[data-i=\"{i}\"]');"
                      "return parseFloat(h.getAttribute('x')) + parseFloat(h.getAttribute('width')) / 2;})()"))


def test_a_click_in_one_arm_selects_the_token_in_the_other_and_moves_the_plots(page):
    b, trace, _ = page
    j = max(1, trace.comparison.first_mismatch.index // 2)
    x, y = _centre(b, f"#arm-vanilla .tk[data-i=\"{j}\"]")
    b.click(x, y)
    assert b.js("Array.from(document.querySelectorAll('.tk.sel')).map(e => e.closest('.arm').id + ':' + e.dataset.i)"
                ) == [f"arm-vanilla:{j}", f"arm-speculative:{j}"]
    for plot in ("plot-margins", "plot-track"):
        assert b.js(f"document.querySelector('#{plot} .cursor').getAttribute('visibility')") == "visible"
        assert _cursor_x(b, plot) == pytest.approx(_hit_x(b, plot, j))
    detail = b.js("document.getElementById('detail').textContent")
    assert detail.startswith(f"token {j}") and f"(id {trace.speculative.tokens[j]})" in detail


def test_hovering_a_plot_selects_that_token_in_both_arms(page):
    b, trace, _ = page
    k = len(trace.vanilla.steps) - 3  # after the fork: the arms' tokens differ there
    x, y = _centre(b, f"#plot-margins .hit[data-i=\"{k}\"]")
    b.hover(x, y)
    assert b.js("Array.from(document.querySelectorAll('.tk.sel')).map(e => +e.dataset.i)") == [k, k]
    assert "after the fork" in b.js("document.getElementById('detail').textContent")
    b.call("Input.dispatchKeyEvent", {"type": "keyDown", "key": "ArrowLeft", "code": "ArrowLeft"})
    assert b.js("Array.from(document.querySelectorAll('.tk.sel')).map(e => +e.dataset.i)") == [k - 1, k - 1]


def test_no_console_error_and_nothing_fetched(page):
    b, _, path = page
    b.js("1")  # let every pending event arrive
    errors = [e for e in b.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]
    assert errors == []
    urls = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    assert urls == [path.as_uri()]
