"""The llama-server engine: run the user's own ``llama-server`` binary, both arms, and compare.

The divergences people report happen inside llama-server's own speculative
paths (``draft-mtp``, ``draft-dspark``, ``draft-eagle3``, ``ngram-mod`` ...),
which live in llama.cpp's C++ common library.  So specview starts the binary
exactly as the user runs it, twice on 127.0.0.1: once without speculation
(vanilla) and once with ``--spec-type`` and its flags (speculative).  Both get
the same token-id prompt on the raw ``/completion`` endpoint with greedy
settings, and the result is an ordinary :class:`~specview.core.trace.Trace`.

What llama-server does not report is recorded as null, never made up:

* no per-round data (``Step.round``, ``from_draft``, ``batch_size``,
  ``batch_index`` are None, ``speculative.rounds`` is empty); the draft totals
  come from ``timings.draft_n`` / ``draft_n_accepted``;
* per-token top-k comes from ``n_probs`` as log-probabilities.  A difference of
  two log-probabilities of one row equals the difference of their logits, so
  ``Step.margin`` is still the top-1 minus top-2 logit gap; ``Step.top_logits``
  holds log-probabilities (logits minus the row's log-sum-exp);
* llama-server reports no top-k for tokens its speculative verify step emits
  (``result.probs`` is left empty there), so those steps have empty top-k and a
  None margin;
* no time spent inside forward passes (``eval_ms`` is None).

Servers never outlive specview: each runs in its own process group, is
stopped on return, error, cancel and interpreter exit (``atexit``, SIGTERM,
SIGINT), and on Linux gets ``PR_SET_PDEATHSIG`` so the kernel kills it if
specview itself is SIGKILLed.  Its output goes to a log file whose tail is
quoted in errors and kept in the trace.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core.engine import ModelFileError, SpecviewError

__all__ = [
    "ServerError",
    "LlamaServer",
    "find_server_bin",
    "cached_server_path",
    "server_spec_types",
    "server_version",
    "server_devices",
    "server_info",
    "run_server_trace",
    "diagnose_server",
    "format_server_verdict",
    "completion_body",
    "BUILD_VERSION",
    "ENV_BIN",
]

#: llama-cpp-python version whose vendored llama.cpp ``scripts/build-llama-server.sh`` builds
BUILD_VERSION = "0.3.36"
#: environment variable naming the llama-server binary
ENV_BIN = "SPECVIEW_LLAMA_SERVER"
HOST = "127.0.0.1"
#: seconds to wait for /health to say the model is loaded
START_TIMEOUT = float(os.environ.get("SPECVIEW_SERVER_START_TIMEOUT", "300"))
#: seed sent with every request (greedy decoding does not use it; it is fixed anyway)
SEED = 1234
#: spec types that read a separate draft file given with -md
DRAFT_FILE_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
MARGIN_MEANING = ("log-probability difference top-1 minus top-2 of the target's pre-sampling distribution "
                  "(equal to the logit difference: log-softmax shifts a row by one constant); "
                  "null where llama-server reported no top-k")
TOP_LOGITS_MEANING = "log-probabilities (logits minus the row's log-sum-exp), from llama-server's n_probs"

ProgressFn = Callable[[str], None]
CancelFn = Callable[[], bool]


class ServerError(SpecviewError):
    """llama-server could not be found, started, or kept running, or it answered with an error."""


class Cancelled(SpecviewError):
    """The caller's cancel check turned True while a server was starting or answering."""


# -- finding the binary --------------------------------------------------------------------
def cached_server_path(version: str = BUILD_VERSION) -> Path:
    """Where ``scripts/build-llama-server.sh`` puts the binary it builds."""
    from ..core.demo import cache_dir

    return cache_dir() / "llama-server" / version / "llama-server"


def find_server_bin(explicit: str | os.PathLike[str] | None = None) -> str:
    """The llama-server to run: ``explicit``, else ``$SPECVIEW_LLAMA_SERVER``, else PATH, else the cached build."""
    for source, value in (("--server-bin", explicit), (f"${ENV_BIN}", os.environ.get(ENV_BIN))):
        if value:
            return _check_bin(str(value), source)
    found = shutil.which("llama-server")
    if found:
        return _check_bin(found, "PATH")
    cached = cached_server_path()
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    raise ServerError(
        "no llama-server binary found: give one with --server-bin PATH (or set "
        f"${ENV_BIN}), put llama-server on PATH, or build one with scripts/build-llama-server.sh "
        f"(it lands in {cached})"
    )


def _check_bin(path: str, source: str) -> str:
    p = Path(path).expanduser()
    if os.sep not in path and not p.exists():
        w = shutil.which(path)
        if w:
            p = Path(w)
    if not p.exists():
        raise ServerError(f"llama-server binary {path} (from {source}) does not exist")
    if p.is_dir():
        raise ServerError(f"llama-server binary {path} (from {source}) is a directory, not a program")
    if not os.access(p, os.X_OK):
        raise ServerError(f"llama-server binary {path} (from {source}) is not executable (chmod +x it)")
    return str(p.resolve())


def _run_bin(binary: str, args: Sequence[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        cp = subprocess.run([binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ServerError(f"{binary} {' '.join(args)} did not finish within {timeout:.0f} s") from None
    except OSError as exc:
        raise ServerError(f"cannot run {binary}: {exc.strerror or exc}") from None
    return cp.returncode, cp.stdout.decode("utf-8", "replace")


_INFO: dict[tuple, dict[str, Any]] = {}
_INFO_LOCK = threading.Lock()


def server_info(binary: str) -> dict[str, Any]:
    """The binary's ``--version``, ``--list-devices`` and the spec types its ``--help`` lists (cached)."""
    binary = _check_bin(binary, "argument")
    st = os.stat(binary)
    key = (binary, st.st_mtime_ns, st.st_size)
    with _INFO_LOCK:
        if key in _INFO:
            return dict(_INFO[key])
    rc, out = _run_bin(binary, ["--version"])
    if rc != 0 or "version" not in out.lower():
        raise ServerError(f"{binary} does not look like llama-server: `--version` exited with {_rc_text(rc)}"
                          + (f" and printed:\n{_tail_text(out, 8)}" if out.strip() else " and printed nothing"))
    version = "\n".join(ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("load_backend", "ggml_")))
    rc_d, devices_out = _run_bin(binary, ["--list-devices"])
    devices = _parse_devices(devices_out) if rc_d == 0 else []
    rc_h, help_out = _run_bin(binary, ["--help"])
    info = {
        "binary": binary,
        "version": version.strip(),
        "devices": devices,
        "devices_raw": devices_out.strip() if rc_d == 0 else None,
        "spec_types": parse_spec_types(help_out),
        "help_flags": sorted(set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", help_out))),
    }
    with _INFO_LOCK:
        _INFO[key] = info
    return dict(info)


def parse_spec_types(help_text: str) -> list[str]:
    """The spec types from the ``--spec-type`` line of llama-server's ``--help`` (empty if it has none)."""
    m = re.search(r"--spec-type\s+([a-z0-9][a-z0-9,\-]*)", help_text)
    if not m:
        return []
    return [t for t in m.group(1).split(",") if t]


def _parse_devices(text: str) -> list[str]:
    out = []
    seen = False
    for ln in text.splitlines():
        if ln.strip().lower().startswith("available devices"):
            seen = True
            continue
        if seen and ln.strip() and ln.strip() != "(none)":
            out.append(ln.strip())
    return out


def server_spec_types(binary: str | None = None) -> list[str]:
    """The ``--spec-type`` values this llama-server offers, as its own ``--help`` lists them."""
    return list(server_info(find_server_bin(binary))["spec_types"])


def server_version(binary: str | None = None) -> str:
    return str(server_info(find_server_bin(binary))["version"])


def server_devices(binary: str | None = None) -> list[str]:
    return list(server_info(find_server_bin(binary))["devices"])


# -- process lifetime ----------------------------------------------------------------------
_LIVE: "weakref.WeakSet[LlamaServer]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False
_PREV_HANDLERS: dict[int, Any] = {}


def _stop_all() -> None:
    for srv in list(_LIVE):
        try:
            srv.stop(grace=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _on_signal(signum: int, frame: Any) -> None:
    _stop_all()
    prev = _PREV_HANDLERS.get(signum)
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                prev = signal.getsignal(sig)
                if prev == signal.SIG_IGN:  # whoever started us wants it ignored: leave it so
                    continue
                _PREV_HANDLERS[sig] = prev
                signal.signal(sig, _on_signal)
            except (ValueError, OSError):  # pragma: no cover - not the main thread / not allowed
                pass
    _HANDLERS_INSTALLED = True


def _make_preexec() -> Callable[[], None] | None:
    """On Linux: have the kernel SIGKILL the server when the thread that started it dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _rc_text(rc: int | None) -> str:
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def _tail_text(text: str, n: int) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def _port_in_use(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama-server's own bind does
        s.bind((HOST, port))
    except OSError:
        return True
    finally:
        s.close()
    return False


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LlamaServer:
    """One llama-server process on 127.0.0.1: started, health-checked, asked, stopped.

    ``port=0`` (the default) lets the server pick a free port itself and reads
    it from its ``listening on`` line, so there is no race for the port.
    """

    def __init__(self, binary: str, args: Sequence[str], *, label: str, port: int = 0,
                 progress: ProgressFn | None = None):
        self.binary = binary
        self.args = [str(a) for a in args]
        self.label = label
        self.port = int(port)
        self.progress = progress or (lambda msg: None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: Any = None
        self.log_path: Path | None = None
        self._final_log: str | None = None
        self.returncode: int | None = None

    # -- lifetime ------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [self.binary, *self.args, "--host", HOST, "--port", str(self.port)]

    def start(self) -> "LlamaServer":
        if self.proc is not None:
            raise ServerError(f"llama-server ({self.label}) was already started")
        if self.port and _port_in_use(self.port):
            raise ServerError(f"cannot start llama-server ({self.label}): port {self.port} on {HOST} is already "
                              "in use by another program")
        _install_handlers()
        fd, name = tempfile.mkstemp(prefix=f"specview-llama-server-{self.label}-", suffix=".log")
        self.log_path = Path(name)
        self._log_fh = os.fdopen(fd, "wb")
        try:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=self._log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_make_preexec(), close_fds=True,
            )
        except OSError as exc:
            self._cleanup_log()
            raise ServerError(f"cannot start llama-server {self.binary}: {exc.strerror or exc}") from None
        _LIVE.add(self)
        self.progress(f"started llama-server ({self.label}) pid {self.proc.pid}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        if self._final_log is not None:
            return self._final_log
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 256 * 1024))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 12) -> str:
        return _tail_text(self.log_text(), n)

    def _died(self, when: str) -> ServerError:
        rc = self.proc.poll() if self.proc else None
        log = self.log_text()
        cause = ""
        if "couldn't bind" in log or "Address already in use" in log:
            cause = f": port {self.port} on {HOST} is already in use"
        elif "failed to load model" in log or "error loading model" in log:
            cause = ": it could not load the model"
        elif re.search(r"(invalid argument|error: .*argument|unknown argument)", log, re.I):
            cause = ": it rejected its command line"
        tail = self.log_tail(14)
        return ServerError(
            f"llama-server ({self.label}, pid {self.pid}) exited {when} with {_rc_text(rc)}{cause}.\n"
            f"  command: {shlex.join(self.command())}\n"
            + (f"  last lines of its output:\n{tail}" if tail else "  it printed nothing")
        )

    def wait_ready(self, timeout: float = START_TIMEOUT, cancel: CancelFn | None = None) -> None:
        """Poll ``/health`` until it answers 200, the process exits, or ``timeout`` passes."""
        cancel = cancel or (lambda: False)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if not self.alive():
                raise self._died("while starting")
            if cancel():
                raise Cancelled("cancelled while llama-server was starting")
            if self.port == 0:
                m = re.search(r"listening on https?://[^\s:]+:(\d+)", self.log_text())
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    with _NO_PROXY.open(self.url + "/health", timeout=2.0) as r:
                        if r.status == 200:
                            self.progress(f"llama-server ({self.label}) ready on {HOST}:{self.port}")
                            return
                except urllib.error.HTTPError as exc:
                    if exc.code not in (503,):
                        raise ServerError(f"llama-server ({self.label}) /health answered HTTP {exc.code}") from None
                except (urllib.error.URLError, OSError):
                    pass
            if time.monotonic() > deadline:
                tail = self.log_tail(10)
                self.stop()
                raise ServerError(f"llama-server ({self.label}) was not ready within {timeout:.0f} s"
                                  + (f"; last lines of its output:\n{tail}" if tail else ""))
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds; keep the log's tail."""
        proc = self.proc
        if proc is not None and self.returncode is None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
            try:  # whatever is left of the group (the server itself or anything it spawned)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
                pass
            self.returncode = proc.returncode
        _LIVE.discard(self)
        if self._final_log is None and self.log_path is not None:
            self._final_log = self.log_text()
        self._cleanup_log()

    def _cleanup_log(self) -> None:
        if self._log_fh is not None:
            try:
                self._log_fh.close()
            except OSError:
                pass
            self._log_fh = None
        if self.log_path is not None:
            try:
                self.log_path.unlink()
            except OSError:
                pass

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ------------------------------------------------------------------
    def get(self, path: str, *, timeout: float = 30.0) -> dict[str, Any]:
        return self._call("GET", path, None, timeout=timeout)

    def post(self, path: str, body: dict[str, Any], *, timeout: float = 3600.0,
             cancel: CancelFn | None = None) -> dict[str, Any]:
        return self._call("POST", path, body, timeout=timeout, cancel=cancel)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, *, timeout: float,
              cancel: CancelFn | None = None) -> dict[str, Any]:
        """One HTTP request, answered on a helper thread so death and cancel are noticed at once."""
        if not self.alive():
            raise self._died("before a request")
        cancel = cancel or (lambda: False)
        box: dict[str, Any] = {}
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})

        def work() -> None:
            try:
                with _NO_PROXY.open(req, timeout=timeout) as r:
                    box["status"], box["body"] = r.status, r.read()
            except urllib.error.HTTPError as exc:
                box["status"], box["body"] = exc.code, exc.read()
            except BaseException as exc:  # noqa: BLE001 - reported below
                box["error"] = exc

        t = threading.Thread(target=work, name=f"llama-server-{self.label}-request", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            if not t.is_alive():
                break
            if cancel():
                self.stop(grace=1.0)
                raise Cancelled(f"cancelled during a request to llama-server ({self.label})")
            if not self.alive():
                t.join(1.0)
                raise self._died("during a request")
        if "error" in box:
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
            if not self.alive():
                raise self._died("during a request")
            raise ServerError(f"request {method} {path} to llama-server ({self.label}) failed: {box['error']}")
        raw = box.get("body", b"")
        try:
            out = json.loads(raw.decode("utf-8", "replace")) if raw else {}
        except json.JSONDecodeError:
            out = {"raw": raw.decode("utf-8", "replace")[:500]}
        if box.get("status", 200) >= 400:
            err = out.get("error") if isinstance(out, dict) else None
            msg = err.get("message") if isinstance(err, dict) else (err or out)
            raise ServerError(f"llama-server ({self.label}) refused {method} {path} with HTTP {box['status']}: {msg}")
        return out


def start_servers(servers: Sequence[LlamaServer], *, timeout: float = START_TIMEOUT,
                  cancel: CancelFn | None = None) -> None:
    """Start every server (they load in parallel) and wait until all are ready; on failure stop them all."""
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready(timeout=timeout, cancel=cancel)
    except BaseException:
        for s in servers:
            s.stop(grace=1.0)
        raise


# -- requests and parsing -------------------------------------------------------------------
def completion_body(prompt: Sequence[int], n_predict: int, *, n_probs: int, ignore_eos: bool = False,
                    cache_prompt: bool = False) -> dict[str, Any]:
    """A greedy ``/completion`` request on a token-id prompt, with every penalty and random sampler off."""
    return {
        "prompt": [int(t) for t in prompt],
        "n_predict": int(n_predict),
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "xtc_probability": 0.0,
        "dry_multiplier": 0.0,
        "repeat_penalty": 1.0,
        "repeat_last_n": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "mirostat": 0,
        "seed": SEED,
        "n_probs": int(n_probs),
        "post_sampling_probs": False,
        "return_tokens": True,
        "cache_prompt": bool(cache_prompt),
        "ignore_eos": bool(ignore_eos),
        "stream": False,
        "n_keep": 0,
    }


STOP_TYPES = {"limit": "max_tokens", "eos": "eos", "word": "stop", "none": "none"}


def _top_from_entry(entry: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    if not isinstance(entry, dict):
        return [], []
    top = entry.get("top_logprobs")
    if top is None:
        top = entry.get("top_probs")
        conv = True
    else:
        conv = False
    ids, vals = [], []
    for t in top or []:
        if not isinstance(t, dict) or "id" not in t:
            continue
        v = t.get("prob") if conv else t.get("logprob")
        if v is None:
            continue
        v = float(v)
        if conv:
            v = math.log(v) if v > 0 else -math.inf
        ids.append(int(t["id"]))
        vals.append(v)
    return ids, vals


def arm_from_response(name: str, resp: dict[str, Any], *, prompt_len: int, piece: Callable[[int], str]) -> Any:
    """An :class:`ArmResult` from one ``/completion`` answer; what the server did not report stays None."""
    from ..core.trace import ArmResult, Step

    tokens = resp.get("tokens")
    probs = resp.get("completion_probabilities") or []
    if not isinstance(tokens, list) or not tokens and probs:
        tokens = [int(p["id"]) for p in probs if isinstance(p, dict) and "id" in p]
    tokens = [int(t) for t in tokens]
    arm = ArmResult(name=name)
    # llama-server leaves a token out of completion_probabilities while its text is an incomplete UTF-8
    # sequence (a byte token of a multi-byte character), so the entries are a subsequence of the tokens:
    # walk both, and a token without its entry gets no top-k rather than its neighbour's
    p = 0
    for i, tok in enumerate(tokens):
        entry = None
        if p < len(probs) and isinstance(probs[p], dict) and int(probs[p].get("id", -1)) == tok:
            entry = probs[p]
            p += 1
        ids, vals = _top_from_entry(entry)
        margin = (vals[0] - vals[1]) if len(vals) >= 2 else None
        arm.steps.append(Step(index=i, token=tok, piece=piece(tok), pos=prompt_len + i, top_ids=ids,
                              top_logits=vals, margin=margin, round=None, from_draft=None, batch_size=None,
                              batch_index=None))
    arm.tokens = tokens
    arm.text = "".join(s.piece for s in arm.steps)
    t = resp.get("timings") or {}
    arm.prompt_ms = float(t.get("prompt_ms") or 0.0)
    arm.gen_ms = float(t.get("predicted_ms") or 0.0)
    arm.eval_ms = None
    arm.stop_reason = STOP_TYPES.get(str(resp.get("stop_type", "")), str(resp.get("stop_type", "")))
    if resp.get("truncated"):
        arm.stop_reason = "context"
    return arm


# -- the vocabulary, without loading weights -------------------------------------------------
def _vocab_model(path: str) -> Any:
    """A :class:`LlamaModel` over ``path`` with only its vocabulary and metadata loaded (no weights)."""
    from . import llama_cpp as lc

    class VocabModel(lc.LlamaModel):
        def __init__(self, p: str):  # noqa: D401 - same as LlamaModel, but vocab_only
            self.path = Path(p).expanduser().resolve()
            lc.check_gguf_file(self.path)
            ll = lc._init()
            self._ll = ll
            self.gpu_layers = 0
            mp = ll.llama_model_default_params()
            mp.vocab_only = True
            mp.n_gpu_layers = 0
            t0 = time.perf_counter()
            model = ll.llama_model_load_from_file(str(self.path).encode("utf-8"), mp)
            if not model:
                raise ModelFileError(f"{self.path}: llama.cpp could not read this model's vocabulary.\n"
                                     f"llama.cpp said:\n{lc.recent_log(6)}")
            self.load_seconds = time.perf_counter() - t0
            self.ptr = model
            self.vocab_ptr = ll.llama_model_get_vocab(model)
            self._vocab = None
            self._pieces = {}
            self.n_ctx_train = ll.llama_model_n_ctx_train(model)
            self.n_vocab = ll.llama_vocab_n_tokens(self.vocab_ptr)
            self.contexts = 0

        def facts(self) -> dict[str, Any]:
            ftype = self.meta("general.file_type")
            return {
                "path": str(self.path),
                "file": self.path.name,
                "file_size": self.path.stat().st_size,
                "backend": "llama-server",
                "architecture": self.meta("general.architecture"),
                "name": self.meta("general.name"),
                "quantization": lc.quant_name(ftype),
                "file_type": int(ftype) if ftype and ftype.isdigit() else None,
                "n_vocab": self.n_vocab,
                "vocab_type": self.vocab.vocab_type,
                "vocab_fingerprint": self.vocab.fingerprint(),
                "n_ctx_train": self.n_ctx_train,
            }

    return VocabModel(path)


# -- the command lines ---------------------------------------------------------------------
#: flags specview sets itself; giving them in --server-args would contradict the run
_RESERVED = {"--host": "specview binds every server to 127.0.0.1",
             "--port": "specview picks free ports itself",
             "-m": "give the target with --target/-m", "--model": "give the target with --target/-m",
             "--spec-type": "give it with specview's --spec-type",
             "-md": "give the draft with --draft/-md", "--model-draft": "give the draft with --draft/-md",
             "--spec-draft-model": "give the draft with --draft/-md",
             "-np": "specview runs one slot per server", "--parallel": "specview runs one slot per server"}
#: flags (other than --spec-*) that configure only the speculative server
_SPEC_ONLY = {"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "-devd", "--device-draft", "-td",
              "--threads-draft", "-tbd", "--threads-batch-draft", "-ctkd", "--cache-type-k-draft", "-ctvd",
              "--cache-type-v-draft", "-otd", "--override-tensor-draft", "-cmoed", "--cpu-moe-draft",
              "-ncmoed", "--n-cpu-moe-draft", "-Cd", "--cpu-mask-draft", "-Crd", "--cpu-range-draft",
              "--cpu-strict-draft", "--prio-draft", "--poll-draft", "-Cbd", "--cpu-mask-batch-draft",
              "-Crbd", "--cpu-range-batch-draft", "--cpu-strict-batch-draft", "--prio-batch-draft",
              "--poll-batch-draft", "--draft-p-min", "--draft-p-split", "-hfd", "-hfrd", "--hf-repo-draft"}


def _looks_like_value(tok: str) -> bool:
    if not tok.startswith("-"):
        return True
    try:
        float(tok)
        return True
    except ValueError:
        return False


def split_server_args(server_args: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Split the user's extra flags into (both servers, speculative server only).

    Flags named ``--spec-*`` and the draft model's own flags (``-ngld``,
    ``-devd``, ``-ctkd`` ...) go to the speculative server only, with their
    value; everything else goes to both, verbatim.
    """
    if server_args is None:
        return [], []
    try:
        toks = shlex.split(server_args) if isinstance(server_args, str) else [str(t) for t in server_args]
    except ValueError as exc:
        raise SpecviewError(f"--server-args: cannot split it into flags ({exc})") from None
    both: list[str] = []
    spec: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        name = tok.split("=", 1)[0]
        if name in _RESERVED:
            raise SpecviewError(f"--server-args must not contain {name}: {_RESERVED[name]}")
        group = spec if (name.startswith("--spec-") or name in _SPEC_ONLY) else both
        group.append(tok)
        i += 1
        if tok.startswith("-") and "=" not in tok and i < len(toks) and _looks_like_value(toks[i]):
            group.append(toks[i])
            i += 1
    return both, spec


def _threads(n: int) -> int:
    from .llama_cpp import default_threads

    return n if n > 0 else default_threads()


def server_command_args(cfg: Any, *, target: str, draft: str | None, n_ctx: int, extra_both: Sequence[str],
                        extra_spec: Sequence[str], known_flags: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """The two servers' flags (without --host/--port): vanilla, and speculative.

    One slot each; with ``--cache-ram 0`` (when the binary has it) no prompt
    state is restored from RAM behind specview's back, so a cached-prompt
    replay evaluates exactly the tokens it means to.
    """
    eng = cfg.engine
    th = _threads(eng.threads)
    common = ["-m", target, "-c", str(n_ctx), "-np", "1", "-b", str(eng.n_batch), "-ub", str(eng.n_ubatch),
              "-fa", eng.flash_attn, "-ctk", eng.kv_type, "-ctv", eng.kv_type, "-t", str(th), "-tb", str(th)]
    if "--cache-ram" in known_flags:
        common += ["--cache-ram", "0"]
    # specview's -1 means "all layers", as in the in-process engine (llama-server's own default is "auto";
    # --server-args "-ngl auto" restores it, since later flags win)
    ngl = str(eng.gpu_layers) if eng.gpu_layers >= 0 else "999"
    common += ["-ngl", ngl]
    vanilla = [*common, *extra_both]
    spec = [*common, "--spec-type", cfg.spec_type]
    if cfg.spec_type != "none":
        spec += ["--spec-draft-n-max", str(cfg.n_max), "--spec-draft-n-min", str(cfg.n_min),
                 "--spec-draft-p-min", f"{cfg.p_min:g}"]
    if draft:
        spec += ["-md", draft, "-ngld", ngl]
    if cfg.spec_type == "ngram-simple":
        spec += ["--spec-ngram-simple-size-n", str(cfg.ngram_size_n),
                 "--spec-ngram-simple-size-m", str(cfg.ngram_size_m)]
    spec += [*extra_both, *extra_spec]
    return vanilla, spec


# -- the whole run --------------------------------------------------------------------------
def run_server_trace(
    cfg: Any,
    *,
    server_bin: str | None = None,
    server_args: str | Sequence[str] | None = "",
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    on_event: Callable[[str, Any], None] | None = None,
    diagnose: bool = True,
    start_timeout: float = START_TIMEOUT,
) -> Any:
    """Run both arms on the user's llama-server and return the :class:`Trace`.

    With ``diagnose`` a fork is diagnosed from the outside while the vanilla
    server is still up (see :func:`diagnose_server`) and stored in
    ``trace.diagnosis``.  Servers are stopped before this returns or raises.
    """
    from ..core import demo
    from ..core.generate import context_needed
    from ..core.session import round_up
    from ..core.trace import ArmResult

    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    binary = find_server_bin(server_bin)
    info = server_info(binary)
    types = info["spec_types"]
    if not types:
        raise ServerError(f"{binary} lists no --spec-type in its --help: it is too old for specview's "
                          "llama-server engine (it needs a llama.cpp with --spec-type)")
    if cfg.spec_type not in types:
        raise SpecviewError(f"--spec-type {cfg.spec_type} is not offered by this llama-server; it offers "
                            f"{', '.join(types)}")
    if cfg.spec_type == "draft-simple" and not cfg.draft:
        raise SpecviewError("--spec-type draft-simple needs a draft model: give --draft FILE")
    target = str(demo.resolve(cfg.target, progress=say))
    draft = str(demo.resolve(cfg.draft, progress=say)) if cfg.draft and cfg.spec_type != "none" else None
    for role, p in (("target", target), ("draft", draft)):
        if p is not None and not Path(p).is_file():
            raise ModelFileError(f"{p}: the {role} model file does not exist")

    vm = _vocab_model(target)
    dm = _vocab_model(draft) if draft else None
    try:
        if cfg.prompt_tokens:
            tokens = [int(t) for t in cfg.prompt_tokens]
            bad = [t for t in tokens if not 0 <= t < vm.n_vocab]
            if bad:
                raise SpecviewError(f"--tokens: id {bad[0]} is outside the target's vocabulary (0..{vm.n_vocab - 1})")
        else:
            tokens = vm.tokenize(cfg.prompt or "", chat=cfg.chat)
        if not tokens:
            raise SpecviewError("the prompt is empty after tokenization")
        n_max_hint = cfg.ngram_size_m if cfg.spec_type.startswith("ngram") else max(cfg.n_max, 16)
        n_ctx = cfg.engine.n_ctx or round_up(context_needed(len(tokens), cfg.max_tokens, n_max_hint))
        both, spec_only = split_server_args(server_args)
        v_args, s_args = server_command_args(cfg, target=target, draft=draft, n_ctx=n_ctx, extra_both=both,
                                             extra_spec=spec_only, known_flags=info["help_flags"])
        vsrv = LlamaServer(binary, v_args, label="vanilla", progress=say)
        ssrv = LlamaServer(binary, s_args, label="speculative", progress=say)
        piece = vm.piece
        cancelled = False
        diagnosis = None
        try:
            say(f"starting two llama-servers ({Path(binary).name}, {cfg.spec_type}) on {HOST}")
            start_servers([vsrv, ssrv], timeout=start_timeout, cancel=cancel)
            props = {}
            for srv in (vsrv, ssrv):
                try:
                    props[srv.label] = _props_summary(srv.get("/props"))
                except ServerError:
                    props[srv.label] = None
            arms: dict[str, Any] = {}
            for srv in (vsrv, ssrv):
                say(f"{srv.label} arm: {cfg.max_tokens} tokens on llama-server pid {srv.pid}")
                body = completion_body(tokens, cfg.max_tokens, n_probs=max(cfg.top_k, 2),
                                       ignore_eos=cfg.ignore_eos)
                resp = srv.post("/completion", body, cancel=cancel)
                arm = arm_from_response(srv.label, resp, prompt_len=len(tokens), piece=piece)
                arms[srv.label] = (arm, resp)
                if on_event:
                    for st in arm.steps:
                        on_event(srv.label, st)
            vanilla, vresp = arms["vanilla"]
            speculative, sresp = arms["speculative"]
            st = sresp.get("timings") or {}
            speculative.drafter = cfg.spec_type
            speculative.reported_drafted = int(st.get("draft_n", 0) or 0)
            speculative.reported_accepted = int(st.get("draft_n_accepted", 0) or 0)
            trace = _build_trace(cfg, info, target, draft, vm, dm, tokens, n_ctx, vanilla, speculative)
            trace.extra["server"] = {
                "margin": MARGIN_MEANING,
                "top_logits": TOP_LOGITS_MEANING,
                "not_reported": ["per-round data (rounds, from_draft, batch_size, batch_index)",
                                 "top-k of tokens emitted by the speculative verify step",
                                 "top-k of tokens whose text is an incomplete UTF-8 sequence",
                                 "time inside forward passes (eval_ms)"],
                "request": {k: v for k, v in completion_body([], cfg.max_tokens, n_probs=max(cfg.top_k, 2),
                                                             ignore_eos=cfg.ignore_eos).items() if k != "prompt"},
                "vanilla": {"args": vsrv.command()[1:], "pid": vsrv.pid, "timings": vresp.get("timings"),
                            "props": props.get("vanilla")},
                "speculative": {"args": ssrv.command()[1:], "pid": ssrv.pid, "timings": sresp.get("timings"),
                                "props": props.get("speculative")},
            }
            if diagnose and not trace.comparison.identical:
                try:
                    diagnosis = diagnose_server(trace, server=vsrv, progress=say, cancel=cancel)
                except Cancelled:
                    say("diagnosis cancelled; the arms are kept")
                    diagnosis = None
                except SpecviewError as exc:
                    diagnosis = _inconclusive(trace, f"the diagnosis could not run: {exc}")
                trace.diagnosis = diagnosis
        except Cancelled:
            cancelled = True
            say("cancelled")
            trace = _build_trace(cfg, info, target, draft, vm, dm, tokens, n_ctx,
                                 ArmResult(name="vanilla", stop_reason="cancelled"),
                                 ArmResult(name="speculative", stop_reason="cancelled", drafter=cfg.spec_type))
        finally:
            for srv in (vsrv, ssrv):
                srv.stop()
        if not cancelled:
            trace.extra["server"]["vanilla"]["log_tail"] = vsrv.log_text().splitlines()[-40:]
            trace.extra["server"]["speculative"]["log_tail"] = ssrv.log_text().splitlines()[-40:]
        return trace
    finally:
        vm.close()
        if dm is not None:
            dm.close()


def _props_summary(props: dict[str, Any]) -> dict[str, Any]:
    gs = props.get("default_generation_settings") or {}
    return {
        "build_info": props.get("build_info"),
        "model_path": props.get("model_path"),
        "n_ctx": gs.get("n_ctx", props.get("n_ctx")),
        "total_slots": props.get("total_slots"),
        "speculative_types": (gs.get("params") or {}).get("speculative.types"),
    }


def _build_trace(cfg: Any, info: dict[str, Any], target: str, draft: str | None, vm: Any, dm: Any,
                 tokens: list[int], n_ctx: int, vanilla: Any, speculative: Any) -> Any:
    from .. import __version__
    from ..core.compare import compare_arms
    from ..core.session import host_environment, prompt_record
    from ..core.trace import Trace

    config = cfg.to_dict()
    config["draft"] = draft
    config["engine_name"] = "llama-server"
    config["n_ctx_used"] = n_ctx
    env = {
        "specview": __version__,
        "backend": "llama-server",
        "engine": "llama-server",
        "llama_server": {
            "binary": info["binary"],
            "version": info["version"],
            "devices": info["devices"],
            "list_devices": info["devices_raw"],
            "spec_types": info["spec_types"],
        },
        **host_environment(),
    }
    return Trace(
        config=config,
        environment=env,
        models={"target": vm.facts(), "draft": dm.facts() if dm is not None else None},
        prompt=prompt_record(cfg, tokens),
        vanilla=vanilla,
        speculative=speculative,
        comparison=compare_arms(vanilla, speculative),
    )


# -- diagnosis from the outside ---------------------------------------------------------------
#: a replayed log-probability may differ from the recorded one by this much and count as reproduced
LOGPROB_TOL = 1e-4


def _row(resp: dict[str, Any]) -> tuple[list[int], list[float]]:
    probs = resp.get("completion_probabilities") or []
    return _top_from_entry(probs[0] if probs else None)


def _gap(ids: list[int], vals: list[float], a: int, b: int) -> tuple[float | None, bool]:
    """lp(a) - lp(b) in one row, and whether it is only a lower bound (b outside the reported top-k)."""
    if a not in ids:
        return None, False
    la = vals[ids.index(a)]
    if b in ids:
        return la - vals[ids.index(b)], False
    return (la - vals[-1], True) if vals else (None, False)


def _rank(ids: list[int], tok: int) -> int | None:
    return ids.index(tok) + 1 if tok in ids else None


def _inconclusive(trace: Any, why: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """An ``inconclusive`` verdict saying plainly what could not be measured."""
    fm = trace.comparison.first_mismatch
    d = dict(base) if base is not None else {
        "version": 1,
        "method": "llama-server (from the outside)",
        "fork": fm.index if fm else None,
        "vanilla_token": fm.vanilla_token if fm else None,
        "speculative_token": fm.speculative_token if fm else None,
        "gap": None,
        "not_measured": [],
    }
    d["not_measured"] = [*d.get("not_measured", []), why]
    d.update(verdict="inconclusive", rule="not-measured", explanation=f"Inconclusive: {why}.")
    return d


def diagnose_server(
    trace: Any,
    *,
    server: LlamaServer | None = None,
    server_bin: str | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
    batch_shapes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Explain a llama-server trace's fork from the outside, with the verdicts of the in-process diagnosis.

    * **The arms' own gaps.**  log p(a) - log p(b) at the fork, a vanilla's token
      and b the speculative one, from each arm's own top-k (the speculative arm
      has none when its verify step emitted the fork token).
    * **Single-token replay.**  On a vanilla server, the shared prefix is built
      by extending a cached prompt one token per request (``cache_prompt``,
      ``n_predict`` 1): the prompt is prefilled as in the vanilla arm, then each
      request evaluates one new token, the shape plain decoding uses.  Each
      position's top-1 and log-probabilities must reproduce what the vanilla arm
      recorded, else the verdict is ``nondeterministic``.
    * **Batched replays at the fork.**  The last T tokens of the shared prefix
      are evaluated in one pass (T = 2 .. n_max + 1, the verify pass's sizes) and
      the fork row read.  A shape that picks b shows the batch shape alone flips
      the argmax: ``near-tie``.  Otherwise the largest movement of logp(a) - logp(b)
      over the shapes is the envelope, and a gap far beyond it
      (``max(4 x envelope, 2.0)``, as in-process) is ``state``.
    * What cannot be measured from outside is listed in ``not_measured``; if the
      fork itself could not be measured the verdict is ``inconclusive``.

    ``server`` is a running vanilla llama-server; without one, one is started
    from the command line recorded in the trace.
    """
    from ..core.diagnose import FAR_FACTOR, FAR_FLOOR, far_threshold

    say = progress or (lambda msg: None)
    cancel = cancel or (lambda: False)
    t_start = time.perf_counter()
    comp, v, s = trace.comparison, trace.vanilla, trace.speculative
    base = {
        "version": 1,
        "method": "llama-server (from the outside)",
        "verdict": None,
        "rule": None,
        "fork": None,
        "vanilla_token": None,
        "speculative_token": None,
        "gap": None,
        "gap_is_lower_bound": False,
        "arms": None,
        "replays": None,
        "envelope": None,
        "thresholds": {"logprob_tol": LOGPROB_TOL, "far_factor": FAR_FACTOR, "far_floor": FAR_FLOOR, "far": None},
        "not_measured": [
            "which verify pass and which row of it emitted the fork token, and what was drafted "
            "(llama-server reports no per-round data)",
            "the speculative server's own KV state: it cannot be rebuilt from outside, so a state fault with a "
            "small gap looks like a near-tie",
        ],
        "explanation": "",
        "seconds": None,
    }
    if comp.identical:
        base.update(verdict="identical", rule="identical",
                    explanation=f"The speculative arm produced exactly vanilla's {comp.agree} tokens.")
        base["seconds"] = round(time.perf_counter() - t_start, 3)
        return base
    fm = comp.first_mismatch
    i, a, b = fm.index, fm.vanilla_token, fm.speculative_token
    base.update(fork=i, vanilla_token=a, speculative_token=b)
    if a is None or b is None:
        short = v if a is None else s
        return _inconclusive(trace, f"the {short.name} arm stopped after {len(short.tokens)} tokens "
                                    f"({short.stop_reason}) while the other went on; there is no fork token to "
                                    "compare", base)

    prompt = [int(t) for t in trace.prompt["tokens"]]
    shared = v.tokens[:i]
    top_k = max(int(trace.config.get("top_k") or 8), 2)
    # -- the arms' own numbers at the fork
    arms: dict[str, Any] = {}
    for arm, x, y in ((v, a, b), (s, b, a)):
        st = arm.steps[i] if i < len(arm.steps) else None
        if st is None or not st.top_ids:
            arms[arm.name] = {"reported": False}
            base["not_measured"].append(
                f"the {arm.name} arm's own top-k at the fork (llama-server did not report it"
                + (": it reports none for tokens its speculative verify step emits)" if arm is s else ")"))
            continue
        g, lb = _gap(st.top_ids, st.top_logits, x, y)
        arms[arm.name] = {"reported": True, "gap": g, "gap_is_lower_bound": lb,
                          "rank_own": _rank(st.top_ids, x), "rank_other": _rank(st.top_ids, y)}
    base["arms"] = arms

    own = server is None
    srv = server
    if own:
        args = ((trace.extra.get("server") or {}).get("vanilla") or {}).get("args")
        if not args:
            return _inconclusive(trace, "the trace does not record the vanilla server's command line, so no "
                                        "replay server can be started", base)
        args = [a_ for a_ in args]
        # drop the recorded --host/--port: a new server gets its own
        clean: list[str] = []
        skip = False
        for tok in args:
            if skip:
                skip = False
                continue
            if tok in ("--host", "--port"):
                skip = True
                continue
            clean.append(tok)
        srv = LlamaServer(find_server_bin(server_bin or trace.environment.get("llama_server", {}).get("binary")),
                          clean, label="replay", progress=say)
        start_servers([srv], cancel=cancel)
    assert srv is not None
    try:
        # -- single-token replay: prompt prefilled as in the vanilla arm, then one token per request
        say(f"replaying the {i} shared tokens one per request on llama-server (cached prompt)")
        t0 = time.perf_counter()
        deviation = None
        max_delta = 0.0
        single = None
        not_one: list[int] = []
        no_topk: list[int] = []
        for j in range(i + 1):
            if cancel():
                raise Cancelled("cancelled during the replay")
            resp = srv.post("/completion", completion_body(prompt + shared[:j], 1, n_probs=top_k, cache_prompt=True),
                            cancel=cancel)
            ids, vals = _row(resp)
            picked = _picked(resp, ids)
            if j > 0 and (resp.get("timings") or {}).get("prompt_n") not in (None, 1):
                not_one.append(j)
            rec = v.steps[j]
            d = _row_delta(ids, vals, rec.top_ids, rec.top_logits) if ids else None
            if not ids:
                no_topk.append(j)
            if picked != rec.token or (d is not None and d > LOGPROB_TOL) or (ids and rec.top_ids and d is None):
                if deviation is None:
                    deviation = j
            if d is not None:
                max_delta = max(max_delta, d)
            if j == i:
                g, lb = _gap(ids, vals, a, b)
                single = {"token": picked, "gap": g, "gap_is_lower_bound": lb, "rank_a": _rank(ids, a),
                          "rank_b": _rank(ids, b), "top_ids": ids, "top_logprobs": [round(x, 5) for x in vals]}
        assert single is not None
        single.update(reproduced=deviation is None, first_deviation=deviation, max_recorded_delta=round(max_delta, 6),
                      requests=i + 1, not_one_token=not_one, no_topk=no_topk,
                      seconds=round(time.perf_counter() - t0, 3))
        if not_one:
            base["not_measured"].append(f"{len(not_one)} single-token replay requests evaluated other than one "
                                        f"token (first at token {not_one[0]}): the server re-used its cache "
                                        "differently")
        if no_topk:
            base["not_measured"].append(
                f"top-k at {len(no_topk)} of the {i + 1} replayed positions (first at token {no_topk[0]}"
                f"{', including the fork' if i in no_topk else ''}): llama-server reports none for a token whose "
                "text is an incomplete UTF-8 sequence (a byte of a multi-byte character); only the tokens were "
                "compared there")
        # -- batched replays at the fork: the last T prefix tokens in one pass
        n_max = int(trace.config.get("n_max") or 3)
        shapes = list(batch_shapes) if batch_shapes is not None else list(range(2, max(2, n_max + 1) + 1))
        full = prompt + shared
        batched = []
        for T in shapes:
            if T > len(full) - 1:
                continue
            if cancel():
                raise Cancelled("cancelled during the replay")
            # leave the cache holding full[:-T] + one other token, so the next request evaluates exactly T tokens
            stub = full[:-T] + [_other_token(full[-T])]
            srv.post("/completion", completion_body(stub, 1, n_probs=0, cache_prompt=True), cancel=cancel)
            resp = srv.post("/completion", completion_body(full, 1, n_probs=top_k, cache_prompt=True), cancel=cancel)
            ids, vals = _row(resp)
            g, lb = _gap(ids, vals, a, b)
            tm = resp.get("timings") or {}
            batched.append({"T": T, "evaluated": tm.get("prompt_n"), "token": _picked(resp, ids), "gap": g,
                            "gap_is_lower_bound": lb, "rank_a": _rank(ids, a), "rank_b": _rank(ids, b),
                            "top_ids": ids, "top_logprobs": [round(x, 5) for x in vals]})
        # -- chunked replays: the whole shared prefix written to the KV cache T tokens per pass, as a
        #    speculative server writes it, then the fork read; every chunk's last row is compared with the
        #    vanilla arm's one-token row at that position (the envelope)
        chunked = []
        series: list[dict[str, Any]] = []
        for T in shapes:
            if i < 1 or T > max(1, i):
                continue
            say(f"replaying the shared prefix {T} tokens per pass")
            srv.post("/completion", completion_body(prompt, 1, n_probs=0, cache_prompt=True), cancel=cancel)
            evaluated = []
            for m in list(range(T, i, T)) + [i]:
                if cancel():
                    raise Cancelled("cancelled during the replay")
                resp = srv.post("/completion", completion_body(prompt + shared[:m], 1, n_probs=top_k,
                                                               cache_prompt=True), cancel=cancel)
                evaluated.append((resp.get("timings") or {}).get("prompt_n"))
                ids, vals = _row(resp)
                if m < i:
                    sh = _relative_shift(ids, vals, v.steps[m].top_ids, v.steps[m].top_logits)
                    if sh is not None:
                        series.append({"index": m, "T": T, "max": round(sh, 5)})
            g, lb = _gap(ids, vals, a, b)
            chunked.append({"T": T, "passes": len(evaluated), "evaluated": evaluated,
                            "token": _picked(resp, ids), "gap": g, "gap_is_lower_bound": lb,
                            "rank_a": _rank(ids, a), "rank_b": _rank(ids, b), "top_ids": ids,
                            "top_logprobs": [round(x, 5) for x in vals]})
    finally:
        if own:
            srv.stop()
    base["replays"] = {"single": single, "batched": batched, "chunked": chunked}
    if batched and any(bt["evaluated"] is not None and bt["evaluated"] != bt["T"] for bt in batched):
        base["not_measured"].append("some batched replays were not evaluated as one T-token pass "
                                    "(the server reused or re-evaluated a different part of the cache)")
    gap = single["gap"]
    base["gap"] = None if gap is None else round(gap, 5)
    base["gap_is_lower_bound"] = single["gap_is_lower_bound"]
    at_fork = [abs(x["gap"] - gap) for x in batched + chunked
               if x["gap"] is not None and gap is not None and not x["gap_is_lower_bound"]
               and not single["gap_is_lower_bound"]]
    shifts = [x["max"] for x in series] + at_fork
    env_max = max(shifts) if shifts else None
    base["envelope"] = {
        "max": None if env_max is None else round(env_max, 5),
        "p95": None if not shifts else round(float(sorted(shifts)[min(len(shifts) - 1, int(0.95 * len(shifts)))]), 5),
        "median": None if not shifts else round(float(sorted(shifts)[len(shifts) // 2]), 5),
        "positions": len(series) + (1 if at_fork else 0),
        "at_fork": None if not at_fork else round(max(at_fork), 5),
        "series": series,
        "measure": "largest change of logit differences relative to the one-token top-1, between one-token "
                   "passes and T-token passes (prefix positions of the chunked replays, and the fork)",
    }
    far = far_threshold(env_max)
    base["thresholds"]["far"] = round(far, 5)

    flips = [x["T"] for x in batched + chunked if x["token"] == b]
    if not single["reproduced"]:
        verdict, rule = "nondeterministic", "vanilla-replay-disagrees"
    elif single["token"] != a:
        verdict, rule = "nondeterministic", "vanilla-replay-disagrees"
    elif gap is None:
        verdict, rule = "inconclusive", "gap-not-measured"
        base["not_measured"].append("the gap at the fork: " + (
            "llama-server reported no top-k there" if not single["top_ids"]
            else "the vanilla token is not in the replay's top-k"))
    elif flips:
        verdict, rule = "near-tie", "batched-replay-flips"
    elif single["gap_is_lower_bound"] or gap > far:
        verdict, rule = "state", "gap-far-beyond-envelope"
    else:
        verdict, rule = "near-tie", "gap-within-envelope" if env_max is not None and gap <= env_max else "gap-below-far"
    base["verdict"], base["rule"] = verdict, rule
    base["explanation"] = _explain_server(base, trace)
    base["seconds"] = round(time.perf_counter() - t_start, 3)
    return base


def _picked(resp: dict[str, Any], ids: list[int]) -> int | None:
    """The token a one-token request generated (reported even when its top-k is not)."""
    toks = resp.get("tokens") or []
    return int(toks[0]) if toks else (ids[0] if ids else None)


def _other_token(tok: int) -> int:
    return tok + 1 if tok > 0 else 1


def _row_delta(ids: list[int], vals: list[float], rec_ids: list[int], rec_vals: list[float]) -> float | None:
    """Largest |difference| of log-probabilities over the tokens both rows report (None if none shared)."""
    rec = dict(zip(rec_ids, rec_vals))
    ds = [abs(v - rec[t]) for t, v in zip(ids, vals) if t in rec]
    return max(ds) if ds else None


def _relative_shift(ids: list[int], vals: list[float], rec_ids: list[int], rec_vals: list[float]) -> float | None:
    """Largest change of log p(x) - log p(top-1) over tokens both rows report; top-1 is the recorded row's.

    Differences of log-probabilities within a row are logit differences, so this is
    how far the logits moved relative to each other, free of the row's normaliser.
    """
    if not rec_ids or rec_ids[0] not in ids:
        return None
    ref_new, ref_old = vals[ids.index(rec_ids[0])], rec_vals[0]
    rec = dict(zip(rec_ids, rec_vals))
    ds = [abs((v - ref_new) - (rec[t] - ref_old)) for t, v in zip(ids, vals) if t in rec]
    return max(ds) if ds else None


def _explain_server(d: dict[str, Any], trace: Any) -> str:
    def piece(tok: int | None) -> str:
        for arm in (trace.vanilla, trace.speculative):
            for st in arm.steps:
                if st.token == tok:
                    return repr(st.piece)
        return f"#{tok}"

    a, b = piece(d["vanilla_token"]), piece(d["speculative_token"])
    single = d["replays"]["single"]
    gap = d["gap"]
    verdict, rule = d["verdict"], d["rule"]
    gap_txt = "n/a" if gap is None else (f"more than {gap:.4f}" if d["gap_is_lower_bound"] else f"{gap:.4f}")
    tail = (" From outside llama-server specview cannot see which verify pass emitted the token or the "
            "speculative server's KV state; see not_measured.")
    if verdict == "nondeterministic":
        return (f"Replaying plain decoding on the same llama-server (one token per request) does not reproduce the "
                f"vanilla arm (first at token {single['first_deviation']}, up to {single['max_recorded_delta']:.4f} "
                f"in log-probability; at the fork it picks {piece(single['token'])}). With a backend that is not "
                f"deterministic a fork between the arms says nothing about speculative decoding.")
    if verdict == "inconclusive":
        return "Inconclusive: " + "; ".join(d["not_measured"][-1:]) + "." + tail
    if verdict == "near-tie" and rule == "batched-replay-flips":
        rp = d["replays"]
        how = [f"the last {x['T']} prefix tokens in one pass" for x in rp["batched"]
               if x["token"] == d["speculative_token"]]
        how += [f"the whole prefix written {x['T']} tokens per pass" for x in rp.get("chunked") or []
                if x["token"] == d["speculative_token"]]
        return (f"One token per pass the target picks {a} over {b} by {gap_txt} logits; with {how[0]} (the "
                f"speculative path's shapes) it picks {b}. The batch shapes alone flip this near-tie: expected on "
                f"quantized targets, not a bug in the speculative loop." + tail)
    env = d["envelope"]["max"]
    env_txt = "not measured" if env is None else f"{env:.4f}"
    if verdict == "near-tie":
        where = ("within that, so" if rule == "gap-within-envelope"
                 else f"beyond that but under the far threshold {d['thresholds']['far']:.3f}, so")
        return (f"One token per pass the target picks {a} over {b} by {gap_txt} logits. Between one-token and "
                f"T-token passes this target's logit differences move by up to {env_txt} on this prefix; the gap is "
                f"{where} a near-tie flipped by batched-versus-single numerics is the likely cause, though no "
                f"replay shape reproduced the flip itself." + tail)
    return (f"One token per pass the target picks {a} over {b} by {gap_txt} logits, far beyond what T-token passes "
            f"move it ({env_txt}; far means above {d['thresholds']['far']:.3f}). Rounding does not do that: suspect "
            f"the speculative path's state (KV rollback, positions, injected draft state). Worth a bug report to "
            f"llama.cpp with the trace." + tail)


def format_server_verdict(diag: dict[str, Any]) -> str:
    """The readable lines ``specview run --engine llama-server`` prints after its summary."""
    lines = [f"VERDICT  {str(diag.get('verdict')).upper()}  (llama-server, measured from the outside)"]
    if diag.get("fork") is not None:
        lines.append(f"  fork at token {diag['fork']}: vanilla {diag['vanilla_token']}, "
                     f"speculative {diag['speculative_token']}")
    arms = diag.get("arms") or {}
    for name in ("vanilla", "speculative"):
        a = arms.get(name)
        if not a:
            continue
        if not a.get("reported"):
            lines.append(f"  {name} arm's own top-k at the fork: not reported by llama-server")
        elif a.get("gap") is None:
            lines.append(f"  {name} arm's own top-k at the fork: its token is not in it")
        else:
            lb = "more than " if a.get("gap_is_lower_bound") else ""
            lines.append(f"  {name} arm's own gap at the fork: {lb}{a['gap']:.4f} (log-prob of its token minus "
                         f"the other arm's)")
    rp = diag.get("replays") or {}
    si = rp.get("single")
    if si:
        g = "n/a" if si.get("gap") is None else f"{'more than ' if si.get('gap_is_lower_bound') else ''}{si['gap']:.4f}"
        lines.append(f"  one token per request: picks {si['token']}, gap log p(a) - log p(b) = {g}; "
                     f"{'reproduces' if si['reproduced'] else 'does NOT reproduce'} the vanilla arm "
                     f"({si['requests']} requests)")
    for bt in rp.get("batched") or []:
        g = "n/a" if bt.get("gap") is None else f"{bt['gap']:.4f}"
        lines.append(f"  last {bt['T']} tokens in one pass: picks {bt['token']} at the fork, gap {g}")
    for ch in rp.get("chunked") or []:
        g = "n/a" if ch.get("gap") is None else f"{ch['gap']:.4f}"
        lines.append(f"  prefix written {ch['T']} tokens per pass ({ch['passes']} passes): picks {ch['token']} at "
                     f"the fork, gap {g}")
    env = diag.get("envelope") or {}
    if env.get("max") is not None:
        lines.append(f"  envelope  max {env['max']:.4f}, p95 {env['p95']:.4f}, median {env['median']:.4f} over "
                     f"{env['positions']} positions (one-token vs T-token passes)")
    th = diag.get("thresholds") or {}
    if th.get("far") is not None:
        env = (diag.get("envelope") or {}).get("max")
        lines.append(f"  thresholds  state: gap > max({th['far_factor']:g} x {'n/a' if env is None else f'{env:.4f}'}, "
                     f"{th['far_floor']:g}) = {th['far']:.4f}; near-tie: a T-token pass picks b, or the gap is below that")
    for nm in diag.get("not_measured") or []:
        lines.append(f"  not measured: {nm}")
    lines.append("  " + diag.get("explanation", ""))
    return "\n".join(lines)


class ServerRunner:
    """Runs matrix cells on the user's llama-server, with the :class:`~specview.core.session.Session` API the matrix uses.

    Each cell starts its own pair of servers (llama-server loads its model at
    start), so ``loads`` counts server starts: a llama-server matrix costs one
    model load per server per cell, unlike the in-process engines, which load each
    file once for the whole matrix.
    """

    def __init__(self, *, server_bin: str | None = None, server_args: str | Sequence[str] | None = "",
                 progress: ProgressFn | None = None):
        self.server_bin = server_bin
        self.server_args = server_args
        self.progress = progress
        self.loads = 0
        self.vanilla_runs = 0
        self.speculative_runs = 0

    def run(self, cfg: Any, *, cancel: CancelFn | None = None, **_: Any) -> Any:
        trace = run_server_trace(cfg, server_bin=self.server_bin, server_args=self.server_args,
                                 progress=self.progress, cancel=cancel, diagnose=True)
        self.loads += 2
        self.vanilla_runs += 1
        self.speculative_runs += 1
        return trace

    def close(self) -> None:
        _stop_all()
