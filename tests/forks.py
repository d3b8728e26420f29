"""A natural fork on the demo model, found instead of assumed.

Whether a quantized target's speculative arm forks from vanilla, and where,
depends on the CPU's kernels and on the thread split, not only on the model: a
configuration that forks at token 243 on one machine is identical on another.
A test that needs a real (unplanted) fork therefore asks :func:`find_fork`,
which runs a short, fixed list of candidate configurations in order and returns
the first one that forks; the test then asserts properties that hold for any
natural fork (its verdict, that both replays reproduce, the gap and the ranks),
never a token index.  Only if no candidate forks does it fail, with a message
naming every configuration it tried and what each gave.

The candidates lead with the kinds of target whose batched and single-token
passes take different kernel paths on every CPU build specview knows of
(K-quant weights, whose repacked batched mat-mul and mat-vec accumulate in
different orders; BF16 and F16 weights through llamafile's tinyBLAS); a run
stops being tried as soon as one forks, so a machine where the first candidate
forks pays for one short run.

Within one test run, a search that found its fork leaves the candidate's name
in ``$SPECVIEW_TEST_FORK_HINTS`` (a folder ``tests/conftest.py`` makes for the
run; its lanes inherit it), and the next search of the same kind (the same
engine, thread count, candidates, overrides and planted probe) tries that
candidate first.  On a machine whose fork comes from a late candidate (no
repacked weights: an AMX Xeon, or CI's planted-crash pass) only the first search
pays for the identical runs before it.  The hint orders and decides nothing:
every search runs its candidates itself and returns a fork it saw, and a hinted
candidate that does not fork is followed by the rest in their order.  Greedy
runs of one build on one machine repeat exactly, so where the two searches
differ in nothing the key leaves out, the hinted candidate is the first in order
that forks: the fork a search without the hint finds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from specview.core.config import DEMO_DRAFT, EngineSettings, RunConfig, default_threads
from specview.core.paths import process_alive
from specview.core.prompts import builtin_prompts
from specview.core.trace import Trace


def prompt_text(name: str) -> str:
    """A built-in prompt's text by name (``essay``, ``technical``, ``code``, ``list``)."""
    return builtin_prompts([name])[0].text


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: a demo target, a built-in prompt, a length and the knobs that move kernels."""

    target: str
    prompt: str
    max_tokens: int
    n_max: int = 3
    flash_attn: str = "auto"
    draft: str = DEMO_DRAFT

    def config(self, *, threads: int = 0, **overrides: Any) -> RunConfig:
        """The run; ``threads=0`` leaves the count to ``$SPECVIEW_THREADS`` or the machine."""
        kw: dict[str, Any] = {
            "target": self.target, "draft": self.draft, "prompt": prompt_text(self.prompt),
            "max_tokens": self.max_tokens, "n_max": self.n_max,
            "engine": EngineSettings(threads=threads, flash_attn=self.flash_attn),
            **overrides,
        }
        return RunConfig(**kw)

    def describe(self) -> str:
        fa = "" if self.flash_attn == "auto" else f" -fa {self.flash_attn}"
        return f"{self.target} <- {self.draft}, prompt {self.prompt}, {self.max_tokens} tokens, n_max {self.n_max}{fa}"


#: Tried in this order; the first that forks is used.  Short runs first: the
#: K-quant target forks within a few dozen tokens on every prompt measured.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("demo:Q4_K_M", "essay", 64),
    Candidate("demo:Q4_K_M", "technical", 64),
    Candidate("demo:Q4_K_M", "code", 64),
    Candidate("demo:BF16", "essay", 64),
    Candidate("demo:Q4_K_M", "list", 128),
    Candidate("demo:F16", "technical", 128),
    Candidate("demo:Q4_K_M", "essay", 128, n_max=8),
    Candidate("demo:Q8_0", "essay", 128, flash_attn="off"),
)


@dataclass
class Fork:
    """A fork found on this machine: the candidate, its run config and trace, and what was tried before it."""

    candidate: Candidate
    cfg: RunConfig
    trace: Trace
    tried: list[str] = field(default_factory=list)

    @property
    def index(self) -> int:
        fm = self.trace.comparison.first_mismatch
        assert fm is not None
        return fm.index

    def describe(self) -> str:
        return f"{self.candidate.describe()}: forks at token {self.index}"


class NoFork(AssertionError):
    """None of the candidates forked on this machine."""


#: the folder one test run's fork searches share (see the module docstring); unset, no search leaves or reads hints
HINTS_ENV = "SPECVIEW_TEST_FORK_HINTS"


HINTS_PREFIX = "specview-test-forks-"


def new_hints_folder(parent: str | None = None) -> str:
    """A new folder for one test run's hints, ``specview-test-forks-<pid>-<random>`` under ``parent`` (the temporary
    folder), after removing those whose run's process is gone: a run killed from outside (SIGTERM, SIGKILL) never
    reached its own clean-up, and the next run takes it away.  A folder whose process still runs (another test run
    at the same time) is left alone."""
    import shutil
    import tempfile

    parent = parent or tempfile.gettempdir()
    for old in Path(parent).glob(f"{HINTS_PREFIX}*-*"):
        pid = old.name[len(HINTS_PREFIX):].partition("-")[0]
        if pid.isdigit() and old.is_dir() and not old.is_symlink() and not process_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{HINTS_PREFIX}{os.getpid()}-", dir=parent)


def _hint_file(kind: str | None, threads: int, candidates: Sequence[Candidate],
               overrides: dict[str, Any]) -> Path | None:
    folder = os.environ.get(HINTS_ENV)
    if not folder or kind is None:
        return None
    key = json.dumps([kind, threads or default_threads(), os.environ.get("SPECVIEW_REPACK_PROBE", ""),
                      sorted((k, repr(v)) for k, v in overrides.items()), [c.describe() for c in candidates]])
    return Path(folder) / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.txt"


def _hinted_first(hint: Path | None, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates in their order, the one an earlier search of this kind found forking moved to the front."""
    order = list(candidates)
    try:
        name = hint.read_text(encoding="utf-8").strip() if hint is not None else ""
    except OSError:
        name = ""
    first = [c for c in order if c.describe() == name]
    return first + [c for c in order if c.describe() != name]


def _leave_hint(hint: Path | None, cand: Candidate) -> None:
    if hint is None:
        return
    tmp = hint.with_name(f"{hint.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(cand.describe() + "\n", encoding="utf-8")
        os.replace(tmp, hint)  # a lane reading it meanwhile sees the old hint or the new one, never half
    except OSError:
        tmp.unlink(missing_ok=True)


def search(run: Callable[[RunConfig], Trace], candidates: Sequence[Candidate] = CANDIDATES, *,
           threads: int = 0, kind: str | None = None, **overrides: Any) -> Fork:
    """The first candidate whose speculative arm differs from vanilla; :class:`NoFork` naming all tried if none does.

    ``run`` runs a config and returns its trace (``Session().run``);
    ``overrides`` change every candidate's config the same way.  A candidate
    whose arms stop short of each other without differing (an end-of-text
    token) counts as identical.  ``kind`` names what ``run`` runs on (a
    Session, llama-server): searches of one kind share their hints (the module
    docstring); without it, the candidates are tried in their order.
    """
    hint = _hint_file(kind, threads, candidates, overrides)
    tried: list[str] = []
    for cand in _hinted_first(hint, candidates):
        cfg = cand.config(threads=threads, **overrides)
        trace = run(cfg)
        fm = trace.comparison.first_mismatch
        if fm is not None and fm.vanilla_token is not None and fm.speculative_token is not None:
            _leave_hint(hint, cand)
            return Fork(cand, cfg, trace, tried)
        tried.append(f"{cand.describe()}: identical over {len(trace.vanilla.tokens)} tokens")
    raise NoFork(
        "no natural fork on this machine: every candidate configuration gave the same text in both arms "
        f"(threads {threads or 'from $SPECVIEW_THREADS or every core'}).\n  tried:\n    "
        + "\n    ".join(tried)
        + "\n  Add a candidate to tests/forks.py that forks on this CPU (a specview matrix over targets, "
        "prompts and n_max shows which)."
    )


def find_fork(session: Any, candidates: Sequence[Candidate] = CANDIDATES, *, threads: int = 0,
              **overrides: Any) -> Fork:
    """:func:`search` on a :class:`~specview.core.session.Session`; a test fails (not errors) when nothing forks."""
    try:
        return search(session.run, candidates, threads=threads, kind=type(session).__qualname__, **overrides)
    except NoFork as exc:
        pytest.fail(str(exc), pytrace=False)


def on_server(cfg: RunConfig, binary: str) -> RunConfig:
    """A candidate's run on llama-server ``binary`` (a 512-token context: every candidate fits)."""
    return replace(cfg, backend="llama-server", engine=replace(cfg.engine, n_ctx=512, server_bin=binary))


def find_server_fork(runner: Any, binary: str, *, threads: int = 1,
                     each: Callable[[Trace], None] | None = None) -> Fork:
    """:func:`search` through a ``ServerRunner`` on llama-server ``binary``; the fork's config is the server run's.
    ``each`` is called with every candidate's trace (to check what holds for any run)."""
    def run(cfg: RunConfig) -> Trace:
        trace = runner.run(on_server(cfg, binary))
        if each is not None:
            each(trace)
        return trace

    try:
        fork = search(run, threads=threads, kind="llama-server")
    except NoFork as exc:
        pytest.fail(f"on llama-server {binary}: {exc}", pytrace=False)
    return replace(fork, cfg=on_server(fork.cfg, binary))
