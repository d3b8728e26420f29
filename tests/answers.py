"""A fake runner that answers a task suite: the vanilla arm always right, the speculative arm wrong on planted items.

The arms' texts are one token per character, ``The answer is 945.``; a planted
item's speculative text has the answer's last digit changed, so the two fork
there.  Each step's margin follows its character (:data:`MARGINS`), so a
near-tie density computed from the texts alone checks the one counted from the
traces.  A cell that drafts nothing (spec type ``none``) answers right on both
arms.  :meth:`AnswerRunner.diagnose` calls the fork of ``state_item`` a state
bug and every other a near-tie.  Both the matrix tests and the Quality tab's
use it, so what a planted item scores is decided in one place.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from specview.core.arms.compare import compare_arms
from specview.core.quality.score import prompt_for
from specview.core.trace import ArmResult, Step, Trace


#: the top-1/top-2 margin (logits, and nats: the row holds two logits) of a step, by its character's class: a
#: digit is a near-tie in every fixed band, a letter only in the 2.0-logit one, anything else in none
MARGINS = {"digit": 0.1, "letter": 1.0, "other": 3.0}


def margin_of(ch: str) -> float:
    return MARGINS["digit" if ch.isdigit() else "letter" if ch.isalpha() else "other"]


def arm(name: str, text: str) -> ArmResult:
    steps = [Step(index=i, token=ord(ch), piece=ch, pos=4 + i, top_ids=[ord(ch), 0],
                  top_logits=[1.0, 1.0 - margin_of(ch)], margin=margin_of(ch)) for i, ch in enumerate(text)]
    return ArmResult(name=name, tokens=[s.token for s in steps], steps=steps, text=text, gen_ms=10.0,
                     stop_reason="eos", drafter=None if name == "vanilla" else "x")


def wrong(answer: str) -> str:
    """The answer with its last digit changed."""
    return answer[:-1] + str((int(answer[-1]) + 1) % 10)


class AnswerRunner:
    """Answers the items of ``suite`` (found by the prompt a run sends for them); records every run."""

    def __init__(self, suite: Any, planted: Iterable[int], *, state_item: int | None = None, chat: bool = True,
                 delay: float = 0.0):
        self.delay = delay  # seconds each run takes (a run long enough to be cancelled)
        self.items = {prompt_for(it, chat): (i, it) for i, it in enumerate(suite.items)}
        self.planted, self.state_item = set(planted), state_item
        self.loads = self.vanilla_runs = self.speculative_runs = 0
        self.calls: list[Any] = []

    def close(self) -> None:
        pass

    def run(self, cfg: Any, *, cancel: Any = None, on_event: Any = None, reuse_vanilla: bool = True) -> Trace:
        self.calls.append(cfg)
        time.sleep(self.delay)
        self.vanilla_runs += 1
        self.speculative_runs += 1
        i, it = self.items[cfg.prompt]
        bad = i in self.planted and cfg.spec_type != "none"
        va = arm("vanilla", f"The answer is {it.answer}.")
        sa = arm("speculative", f"The answer is {wrong(it.answer) if bad else it.answer}.")
        return Trace(config=cfg.to_dict(), environment={"specview": "test"},
                     models={"target": {"file": cfg.target, "quantization": "Q8_0"}, "draft": None},
                     prompt={"text": cfg.prompt, "chat": cfg.chat, "tokens": [1, 2]},
                     vanilla=va, speculative=sa, comparison=compare_arms(va, sa))

    def diagnose(self, trace: Trace, cfg: Any, **_kw: Any) -> dict[str, Any]:
        i, _it = self.items[cfg.prompt]
        return ({"verdict": "state", "rule": "serial-verify-differs", "gap": 6.5} if i == self.state_item else
                {"verdict": "near-tie", "rule": "serial-verify-reproduces-vanilla", "gap": 0.02})
