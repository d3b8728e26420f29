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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from specview.core.config import DEMO_DRAFT, EngineSettings, RunConfig
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


def search(run: Callable[[RunConfig], Trace], candidates: Sequence[Candidate] = CANDIDATES, *,
           threads: int = 0, **overrides: Any) -> Fork:
    """The first candidate whose speculative arm differs from vanilla; :class:`NoFork` naming all tried if none does.

    ``run`` runs a config and returns its trace (``Session().run``);
    ``overrides`` change every candidate's config the same way.  A candidate
    whose arms stop short of each other without differing (an end-of-text
    token) counts as identical.
    """
    tried: list[str] = []
    for cand in candidates:
        cfg = cand.config(threads=threads, **overrides)
        trace = run(cfg)
        fm = trace.comparison.first_mismatch
        if fm is not None and fm.vanilla_token is not None and fm.speculative_token is not None:
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
        return search(session.run, candidates, threads=threads, **overrides)
    except NoFork as exc:
        pytest.fail(str(exc), pytrace=False)
