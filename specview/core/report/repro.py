"""A reproduction that needs no specview: the llama-server command lines and ``/completion`` requests that give a
trace's fork, and the ``-ub 1`` control that tells batched numerics from a state bug.

Built from the trace alone, with the same flag builder the llama-server engine starts its servers with
(:func:`specview.core.llama_flags.server_argv`), so a run on llama-server and its reproduction never disagree:

* a vanilla server (no drafter) and a speculative one, each sent the same request: the prompt's token ids,
  ``n_predict``, the greedy sampler (temperature 0, top-k 1, every penalty and random sampler off) and the
  run's speculative settings (``speculative.n_max`` & co., which builds that read them take per request);
* the same two servers with ``-ub 1``: every pass computes one token, so every verify row is computed as plain
  decoding computes it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecviewError
from ..llama_flags import (
    UB1_REFUSED,
    _line,
    engine_environment,
    server_argv,
    uses_draft_file,
)
from .facts import obj

#: the ports the commands listen on, by server
PORTS = {"vanilla": 8080, "speculative": 8081, "vanilla -ub 1": 8082, "speculative -ub 1": 8083}
#: the file each server's answer is saved to
OUT_FILES = {"vanilla": "vanilla.json", "speculative": "speculative.json", "vanilla -ub 1": "vanilla-ub1.json",
             "speculative -ub 1": "speculative-ub1.json"}
#: the engines whose runs a llama-server reproduces (the same llama.cpp, the same flags)
LLAMA_ENGINES = ("llama.cpp", "llama-server")
SEED = 1234


@dataclass(frozen=True)
class Server:
    """One llama-server to start: its name, the environment ggml reads at start-up, its flags and port."""

    name: str
    env: dict[str, str]
    argv: list[str]
    port: int

    def words(self, program: str = "llama-server") -> list[str]:
        return [*(f"{k}={v}" for k, v in self.env.items()), program, *self.argv, "--port", str(self.port)]

    def line(self) -> str:
        return _line(self.words())


@dataclass(frozen=True)
class Repro:
    """Everything the report's reproduction says: servers, the request, and what each answer must hold."""

    servers: list[Server]
    body: dict[str, Any]
    vanilla: list[int]
    speculative: list[int]
    fork: int | None
    produced_by: str
    control: str
    ub1_refused: str | None = None
    notes: list[str] = field(default_factory=list)

    def server(self, name: str) -> Server | None:
        return next((s for s in self.servers if s.name == name), None)

    def request_line(self, name: str) -> str:
        """The curl line that sends the request to server ``name`` and saves its answer."""
        s = self.server(name)
        assert s is not None
        payload = json.dumps(self.body, separators=(",", ":"))
        return (f"curl -s http://127.0.0.1:{s.port}/completion -H 'Content-Type: application/json' "
                f"-d {shlex.quote(payload)} > {OUT_FILES[name]}")


def greedy_body(tokens: list[int], n_predict: int, *, ignore_eos: bool, speculative: dict[str, Any]) -> dict[str, Any]:
    """The ``/completion`` request of a greedy run: token ids, every sampler but greedy off, no prompt cache."""
    body: dict[str, Any] = {
        "prompt": [int(t) for t in tokens], "n_predict": int(n_predict), "temperature": 0.0, "top_k": 1,
        "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0,
        "repeat_penalty": 1.0, "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "mirostat": 0, "seed": SEED, "cache_prompt": False, "return_tokens": True, "n_keep": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    body.update({f"speculative.{k}": v for k, v in speculative.items()})
    return body


def _recorded_args(trace: Any) -> list[str]:
    """The flags the run's own speculative llama-server was started with (a llama-server trace), else []."""
    rec = obj(obj(obj(obj(trace.extra).get("server")).get("speculative")).get("server"))
    args = rec.get("args")
    return [str(a) for a in args] if isinstance(args, list) else []


def _control_words(trace: Any) -> str:
    """What the ``-ub 1`` pair shows, as the run's own serial-verify control measured it."""
    sv = obj(obj(trace.diagnosis).get("serial_verify"))
    same = sv.get("identical_to_vanilla")
    if same is True:
        also = (", and equal to vanilla.json: -ub 1 does not change plain decoding here"
                if sv.get("vanilla_matches_run") is True else "")
        return ("the two -ub 1 answers are equal" + also + ": with every verify row computed as its own one-token "
                "pass the fork is gone, so it comes from the batched verify pass's numerics, not from the speculative "
                "loop's state (the run's own serial-verify control showed the same)")
    if same is False:
        at = sv.get("first_mismatch")
        return ("the two -ub 1 answers still differ" + (f" (the run's control: from token {at})" if at is not None
                                                        else "") +
                ": computing every verify row alone does not remove the fork, so the speculative loop or its cache "
                "is wrong (a state bug), or the backend is not deterministic")
    return ("if the two -ub 1 answers are equal, the fork comes from the batched verify pass's numerics; if they "
            "still differ, from the speculative loop's state (the run itself did not run this control)")


def reproduction(trace: Any) -> Repro:
    """The no-specview reproduction of ``trace`` (an :class:`~.repro_mlx.MLXRepro` for a run on the MLX engines);
    :class:`SpecviewError` saying why for a run neither server can redo (another engine, settings that do not read
    back as a run)."""
    from ..config import RunConfig

    cfg = obj(trace.config)
    backend = cfg.get("backend") or "llama.cpp"
    from .repro_mlx import MLX_ENGINES, mlx_reproduction

    if backend in MLX_ENGINES:  # an mlx_lm.server reproduction (:mod:`.repro_mlx`)
        return mlx_reproduction(trace)  # type: ignore[return-value]
    if backend not in LLAMA_ENGINES:
        raise SpecviewError(f"no llama-server reproduction: the run used the {backend} engine")
    try:
        run = RunConfig.from_dict(cfg)
    except SpecviewError as exc:
        raise SpecviewError(f"no llama-server reproduction: the trace's settings are not a valid run ({exc})") from None
    config = run.to_dict()
    for key in ("n_ctx_used", "threads_used"):
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool) and cfg[key] > 0:
            config[key] = cfg[key]
    models = obj(trace.models)
    target = str(obj(models.get("target")).get("path") or run.target)
    draft = str(obj(models.get("draft")).get("path") or run.draft) if uses_draft_file(run.spec_type) else None
    extra = ["--cache-ram", "0"] if "--cache-ram" in _recorded_args(trace) else []
    env = engine_environment(config)
    servers = []
    refused = UB1_REFUSED.get(run.spec_type)
    for ub in (None, 1):
        if ub == 1 and refused:
            continue
        for spec in (False, True):
            name = ("speculative" if spec else "vanilla") + (" -ub 1" if ub else "")
            argv = server_argv(config, target=target, draft=draft, speculative=spec, ubatch=ub) + extra
            servers.append(Server(name, env, argv, PORTS[name]))
    body = greedy_body(list(obj(trace.prompt).get("tokens") or []), run.max_tokens, ignore_eos=run.ignore_eos,
                       speculative={"n_max": run.n_max, "n_min": run.n_min, "p_min": run.p_min})
    if backend == "llama-server":
        who = "this run's own llama-server (the same flags, the same request, streamed)"
    else:
        who = "specview's in-process llama.cpp engine (llama-cpp-python)"
    fm = trace.comparison.first_mismatch
    notes = []
    if backend != "llama-server":
        notes.append("the tokens above come from llama-cpp-python in specview's own process; a llama-server of the "
                     "same llama.cpp build runs the same kernels, but its speculative loop is its own, so where it "
                     "drafts (and so where a fork can fall) may differ")
    if cfg.get("stop_after_fork") is not None:
        notes.append(f"the run stopped its speculative arm {cfg['stop_after_fork']} tokens after the fork, so the "
                     "answers agree with it up to there")
    return Repro(servers=servers, body=body, vanilla=list(trace.vanilla.tokens),
                 speculative=list(trace.speculative.tokens), fork=None if fm is None else fm.index,
                 produced_by=who, control=_control_words(trace), ub1_refused=refused, notes=notes)


#: compares two saved answers: the first token where they differ, or that they are equal
COMPARE_SCRIPT = """python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(f))["tokens"] for f in sys.argv[1:3])
i = next((i for i, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y), None)
print(f"identical over {len(a)} tokens" if i is None else f"fork at token {i}: {a[i:i + 1]} against {b[i:i + 1]}")
EOF"""


def compare_function() -> str:
    """A shell function ``same A.json B.json`` that prints where two answers' tokens first differ."""
    return "same() {\n" + COMPARE_SCRIPT + "\n}"


__all__ = ["COMPARE_SCRIPT", "OUT_FILES", "PORTS", "Repro", "Server", "compare_function", "greedy_body",
           "reproduction"]
