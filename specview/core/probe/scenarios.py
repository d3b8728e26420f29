"""The triggers: the situations in which real rollback and state bugs were reported, and how each is forced.

A trigger is forced in-process by a :class:`ScriptedDrafter`: it knows the
target's own greedy continuation (the vanilla arm) and proposes, round by round
as its script says, the target's own tokens (accepted), a wrong first token (the
whole draft rejected), a few right tokens then wrong ones (a partial rejection)
or nothing (a zero-draft round).  The loop, the verify passes, the rollbacks and
the context are the real ones; only who proposes is scripted.  On llama-server
the same triggers are forced with what the server takes: its spec types, drafter
files, ``n_max``, ``p_min``, ``-c`` and ``-np`` (:mod:`.server`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..arms.drafters import Drafter


@dataclass(frozen=True)
class Trigger:
    """One known trigger: its name, what it recreates and the public report it comes from."""

    name: str
    title: str
    report: str  # the public report(s) the trigger recreates
    in_process: str  # how the in-process scenario forces it
    server: str  # how the llama-server scenario forces it


TRIGGERS: tuple[Trigger, ...] = (
    Trigger("zero-after-accept", "accepted drafts followed by a zero-draft round",
            "vLLM #52942 (a stale recurrent state read after accepted drafts), vLLM PR #56531",
            "the drafter proposes the target's own tokens, then nothing, in turn",
            "draft-simple with the target as its own drafter and a p_min that stops some drafts at once"),
    Trigger("whole-reject", "a rejection of the whole draft",
            "llama.cpp #26695 (seq_rm returns true but does not restore)",
            "every draft starts with a token the target does not pick",
            "draft-simple with a drafter that disagrees with the target"),
    Trigger("deep-rollback", "a rollback deeper than the snapshot depth (the checkpoint fallback)",
            "llama.cpp PR #28118 (the full checkpoint fallback), PR #26499",
            "drafts two tokens longer than the snapshots a context keeps, all but the first rejected",
            "draft-simple with a disagreeing drafter at n_max 8: every rollback restores the checkpoint"),
    Trigger("neighbour", "several sequences at once: does a neighbour request change my answer?",
            "llama.cpp #28019 (several sequences at once corrupt each other)",
            "plain greedy alone, then with a second context on the same weights decoding between its passes",
            "a -np 2 server: plain greedy alone, then beside a neighbour request in flight; -ub 1 the control"),
    Trigger("context-edge", "the context boundary reached in the middle of a draft",
            "mlx-lm #846 (tokens skipped), llama.cpp context-full handling",
            "a context just large enough: the last drafts are cut by the context's last cell",
            "a -c just large enough for the prompt and the generation: the last drafts are cut by it"),
    Trigger("long-run", "a long run where state accumulates",
            "vLLM PR #56531 (a stale state that nothing detects), mlx-lm #990 (a trim that corrupted the state)",
            "2,000+ tokens of accepted, partial, whole-rejected and zero-draft rounds in turn",
            "2,000+ tokens of draft-simple with a drafter that agrees in part"),
    Trigger("ngram-loop", "the n-gram spec types on a text that loops",
            "llama.cpp #25819 (ngram-mod loops), vLLM #39273 / #40875 (GDN and Mamba-2 with n-gram drafting)",
            "ngram-simple (the n-gram type specview runs in-process) on a looping prompt",
            "ngram-map-k, ngram-map-k4v and ngram-mod (those the binary offers) on a looping prompt"),
    Trigger("rollback-modes", "every rollback mode the architecture allows",
            "llama.cpp #26695, mlx-lm #990",
            "partial rejections in each mode the context accepts (seq-rm, snapshots, checkpoint)",
            "the modes llama-server picks: draft-simple (checkpoint, or seq-rm on a KV cache), draft-mtp "
            "(snapshots) where the target has MTP heads"),
)
BY_NAME = {t.name: t for t in TRIGGERS}
NAMES = tuple(t.name for t in TRIGGERS)

#: what a round of a script proposes: the target's own tokens, a wrong first token, ``k`` right ones then wrong
#: ones ("partial"), the target's own tokens beyond ``n_max`` ("deep": a draft longer than the snapshots), nothing
MOVES = ("accept", "reject", "partial", "deep", "none")


def check_triggers(names: Sequence[str] | None) -> tuple[str, ...]:
    """The trigger names asked for (all when none), each checked; a ValueError names an unknown one."""
    if not names:
        return NAMES
    bad = [n for n in names if n not in BY_NAME]
    if bad:
        raise ValueError(f"unknown trigger {bad[0]!r}; the triggers are {', '.join(NAMES)}")
    return tuple(n for n in NAMES if n in names)


class ScriptedDrafter(Drafter):
    """Proposes what its script says, knowing the target's own greedy continuation (``oracle``).

    ``oracle`` is the prompt followed by the vanilla arm's tokens: the token the
    target picks after ``history + [id_last]`` is ``oracle[len(history) + 1]``
    for as long as the arm is still vanilla's.  Round ``r`` (1-based) plays
    ``script[(r - 1) % len(script)]``; ``moves`` records what each round did.
    """

    spec_type = "scripted"

    def __init__(self, oracle: Sequence[int], script: Sequence[str], *, n_max: int, n_vocab: int,
                 avoid: frozenset[int] = frozenset(), deep: int = 0, edge: bool = False):
        super().__init__()
        bad = [m for m in script if m not in MOVES]
        if bad or not script:
            raise ValueError(f"a script is a list of {', '.join(MOVES)} (got {list(script)})")
        self.oracle = [int(t) for t in oracle]
        self.script = tuple(script)
        self.n_max = int(n_max)
        self.n_vocab = int(n_vocab)
        self.avoid = avoid  # tokens never proposed as a wrong token (end-of-generation)
        self.deep = int(deep)  # the length of a "deep" draft
        self.edge = edge  # walk to the run's end one token a round, so that the last draft is cut by it
        self.rounds = 0
        self.moves: list[str] = []
        self.cut = 0  # rounds whose draft the run's end (the context's edge) cut short

    def wrong(self, right: int) -> int:
        """A token other than ``right`` (and than any token to avoid)."""
        t = (right + 1) % self.n_vocab
        while t == right or t in self.avoid:
            t = (t + 1) % self.n_vocab
        return t

    def draft(self, history: Sequence[int], id_last: int, n_max: int) -> list[int]:
        self.rounds += 1
        move = self.script[(self.rounds - 1) % len(self.script)]
        pos = len(history) + 1  # the oracle index of the first token to propose
        ahead = self.oracle[pos:]
        want = self.deep if move == "deep" else self.n_max
        if self.edge and want <= n_max <= 2 * want + 1:
            move = "none"  # one token this round: the next draft that fits no longer does
        n = min(n_max, want)
        if move != "none" and n < want:
            self.cut += 1
        if move == "none" or n <= 0 or not ahead:
            self.moves.append("none")
            return []
        self.moves.append(move)
        if move == "accept":
            return list(ahead[:n])
        if move == "reject":
            out = [self.wrong(ahead[0])] + list(ahead[1:n])
            return out[:n]
        k = 1 if n > 1 else 0  # partial / deep: one right token, then wrong ones
        out = list(ahead[:k])
        while len(out) < n:
            right = ahead[len(out)] if len(out) < len(ahead) else 0
            out.append(self.wrong(right))
        return out

    def describe(self) -> dict:
        return {"spec_type": self.spec_type, "script": list(self.script), "n_max": self.n_max, "deep": self.deep}


@dataclass(frozen=True)
class Scenario:
    """One in-process run of the speculative loop that forces a trigger."""

    trigger: str
    label: str  # what the row says beside the trigger (a mode, a spec type)
    script: tuple[str, ...] = ("accept",)
    max_tokens: int = 48
    n_max: int = 3
    n_max_hint: int | None = None  # the loop's context plan (None: n_max); deep rollbacks plan fewer than they draft
    deep: int = 0
    rollback: str | None = None  # None: the run's own setting
    n_ctx: int | None = None  # None: sized to the run
    prompt: str | None = None  # None: the probe's prompt
    ngram: bool = False  # an n-gram drafter instead of the script
    edge: bool = False  # the script walks to the run's end so that its last draft is cut (ScriptedDrafter.edge)
    extra: dict = field(default_factory=dict, hash=False, compare=False)


#: a looping prompt for the n-gram trigger: the n-gram drafters draft only where the text repeats itself
LOOP_PROMPT = " ".join(["the cat and the dog sat on the mat"] * 6)


def in_process_scenarios(names: Sequence[str], *, n: int, long_n: int, n_max: int, depth: int,
                         modes: Sequence[str]) -> list[Scenario]:
    """The in-process scenarios of ``names``: ``n`` tokens each (``long_n`` for the long run), drafts of
    ``n_max``, a snapshot depth of ``depth``, one rollback-modes row per mode in ``modes``."""
    out: list[Scenario] = []
    for name in names:
        if name == "zero-after-accept":
            out.append(Scenario(name, "accept, none", ("accept", "none"), n, n_max))
        elif name == "whole-reject":
            out.append(Scenario(name, "reject", ("reject",), n, n_max))
        elif name == "deep-rollback":
            out.append(Scenario(name, f"{depth + 2}-token drafts, {depth} kept", ("deep", "accept"), n, n_max,
                                n_max_hint=depth, deep=depth + 2))
        elif name == "context-edge":
            out.append(Scenario(name, "last cell", ("accept", "partial"), n, n_max, n_max_hint=0, edge=True))
        elif name == "long-run":
            out.append(Scenario(name, f"{long_n} tokens", ("accept", "partial", "none", "reject", "accept"),
                                long_n, n_max))
        elif name == "ngram-loop":
            out.append(Scenario(name, "ngram-simple", (), n, n_max, prompt=LOOP_PROMPT, ngram=True))
        elif name == "rollback-modes":
            for mode in modes:
                out.append(Scenario(name, mode, ("partial", "accept", "reject"), n, n_max, rollback=mode))
    return out
