"""The no-specview reproduction of a run on the MLX engines (``mlx``, ``mlx-server``): the ``mlx_lm.server`` command
lines, the greedy request both are sent, and the control mlx_lm.server allows in place of llama-server's ``-ub 1``.

The command lines and the request are made by the ``mlx-server`` engine's own builders
(:func:`specview.backends.mlx_server.process.server_args`, ``kv_flags``, ``split_server_args`` and
:func:`specview.backends.mlx_server.protocol.arm_request`), asked of the registered engine
(``get_backend("mlx-server").command_builders()``: core imports no backend), so a run on mlx_lm.server and its reproduction never disagree:

* a vanilla server (the target alone) and a speculative one (``--draft-model``, ``--num-draft-tokens`` n_max, or 0
  for the zero-draft control p_min 1), each sent the same request: the prompt as text (mlx_lm.server reads no
  token ids; a chat prompt as the user message, the server applies the template), ``max_tokens``, the greedy
  sampler, and ``logprobs`` with no top list, so each answer's ``logprobs.content[].id`` is the token it emitted;
* mlx_lm.server has no ``-ub 1``: the control it allows is the same request with ``num_draft_tokens`` 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecviewError
from ..llama_flags import _line
from .escape import md_fence, md_text
from .facts import obj

#: the engines whose runs an mlx_lm.server reproduces
MLX_ENGINES = ("mlx", "mlx-server")
#: the ports the commands listen on, by server
PORTS = {"vanilla": 8080, "speculative": 8081}
#: the file each answer is saved to
OUT_FILES = {"vanilla": "vanilla.json", "speculative": "speculative.json", "zero-draft": "speculative-0draft.json"}
#: the control's request: request.json with num_draft_tokens 0
CONTROL_FILE = "request-0draft.json"
#: what mlx_lm.server is started with besides its flags (specview's servers get the same)
SERVER_ENV = {"HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class MLXLaunch:
    """One mlx_lm.server to start: its name, its flags (without --host/--port) and its port."""

    name: str
    argv: list[str]
    port: int

    def words(self, program: str = "mlx_lm.server") -> list[str]:
        return [*(f"{k}={v}" for k, v in SERVER_ENV.items()), program, *self.argv, "--host", "127.0.0.1",
                "--port", str(self.port)]

    def line(self) -> str:
        return _line(self.words())


@dataclass(frozen=True)
class MLXRepro:
    """Everything the report's mlx_lm.server reproduction says: servers, the request, what each answer holds."""

    servers: list[MLXLaunch]
    endpoint: str
    body: dict[str, Any]
    n_prompt: int
    vanilla: list[int]
    speculative: list[int]
    fork: int | None
    produced_by: str
    num_draft_tokens: int | None
    control: str
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def port(self, arm: str) -> int:
        """The port ``arm``'s request goes to (with no draft model both go to the vanilla server)."""
        s = next((s for s in self.servers if s.name == arm), self.servers[0])
        return s.port

    def curl(self, arm: str, data: str, out: str) -> str:
        return (f"curl -s http://127.0.0.1:{self.port(arm)}{self.endpoint} -H 'Content-Type: application/json' "
                f"-d @{data} > {out}")


# -- the settings ---------------------------------------------------------------------------------------------
#: engine settings with no mlx-lm meaning (the in-process MLX engine ignores them too)
_LLAMA_ONLY = ("n_ctx", "n_ubatch", "flash_attn", "gpu_layers", "threads", "no_op_offload", "no_repack",
               "vk_disable_mmvq", "vk_force_mmvq", "vk_disable_f16", "vk_disable_coopmat", "vk_visible_devices")


def unmatched_settings(run: Any, backend: str) -> list[str]:
    """The run's settings mlx_lm.server has no equivalent of, each with what the reproduction does instead."""
    from ..config import EngineSettings

    out = []
    if run.n_min:
        out.append(f"n_min {run.n_min}: mlx-lm never drops a short draft; the speculative server drafts "
                   "n_max tokens every round")
    if 0.0 < run.p_min < 1.0:
        out.append(f"p_min {run.p_min:g}: mlx-lm drafts a fixed number of tokens, with no probability cut-off; the "
                   "speculative server drafts n_max tokens every round")
    if run.serial_verify:
        out.append("serial_verify: the run computed each verify row as its own one-token pass; mlx_lm.server always "
                   "verifies a draft in one batched pass, so its speculative answer is the plain speculative one, "
                   "not this run's")
    eng = run.engine
    if eng.rollback not in (None, "auto", "seq-rm"):
        out.append(f"rollback {eng.rollback}: specview's in-process engine rolled the cache back by restoring "
                   "checkpoints; mlx_lm.server only trims it (and refuses to speculate on a cache it cannot trim)")
    if eng.server_bin and backend == "mlx-server":
        out.append(f"server_bin {eng.server_bin}: the run started this program; the commands say mlx_lm.server")
    base, mine = EngineSettings().to_dict(), eng.to_dict()
    ignored = [f"{k} {mine[k]}" for k in _LLAMA_ONLY
               if k in mine and mine[k] != base.get(k) and mine[k] not in (None, False, "", "auto")]
    if ignored:
        out.append("llama.cpp settings with no MLX meaning, which the run's engine ignored as well: "
                   + ", ".join(ignored))
    return out


def _folders(trace: Any, run: Any) -> tuple[str, str | None]:
    cfg, models = obj(trace.config), obj(obj(trace.config).get("models"))
    target = cfg.get("target_folder") or obj(models.get("target")).get("path") or run.target
    draft = None
    if run.spec_type == "draft-simple" and run.draft:
        draft = cfg.get("draft_folder") or obj(models.get("draft")).get("path") or run.draft
    return str(target), (str(draft) if draft else None)


def _recorded(trace: Any, arm: str) -> dict[str, Any]:
    """What an mlx-server run recorded of ``arm``'s server and request (empty for an in-process run)."""
    return obj(obj(obj(trace.extra).get("server")).get(arm))


def _group_size(trace: Any, target: str) -> int:
    """The quantized KV cache's group size the run used (recorded by a server run, else from the folder)."""
    args = [str(a) for a in _recorded(trace, "vanilla").get("args") or []]
    if "--kv-group-size" in args[:-1]:
        return int(args[args.index("--kv-group-size") + 1])
    from ..registry import get_backend

    try:
        vm = get_backend("mlx-server").runner().vocab_model(target)
        return int(get_backend("mlx-server").kv_group_size(vm.config))
    except Exception as exc:  # noqa: BLE001 - the folder is gone or unreadable: say so
        raise SpecviewError(f"no mlx_lm.server reproduction: the run's quantized KV cache needs the group size of "
                            f"{target}, which cannot be read here ({exc})") from None


def _prompt(trace: Any, run: Any, target: str) -> tuple[str, bool, frozenset[int] | None]:
    """(the text the servers are sent, whether as a chat, the ids ``ignore_eos`` bans or None if unknown yet)."""
    text = obj(trace.prompt).get("text")
    chat = bool(run.chat and not run.prompt_tokens)
    if text is not None and not run.prompt_tokens:
        return str(text), chat, None
    from ..registry import get_backend

    try:  # ids: their text, checked to tokenize back to them, as the mlx-server engine does before a run
        runner = get_backend("mlx-server").runner()
        vm = runner.vocab_model(target)
        _ids, text = runner._prompt(run, vm)
    except Exception as exc:  # noqa: BLE001 - ids that are not their text's, mlx-lm missing, the folder gone
        if getattr(exc, "setting", None) == "prompt_tokens":
            raise SpecviewError(f"no mlx_lm.server reproduction: {exc}") from None
        raise SpecviewError(f"no mlx_lm.server reproduction: the prompt is token ids and mlx_lm.server reads text; "
                            f"the target's tokenizer ({target}) cannot be read here to make their text "
                            f"({str(exc).rstrip('.')})") from None
    return text, False, vm.vocab.eog


def _ban(trace: Any, target: str, known: frozenset[int] | None) -> list[int]:
    """The end-of-generation ids ``ignore_eos`` bans (as recorded by a server run, else the target's)."""
    bias = obj(_recorded(trace, "vanilla").get("request")).get("logit_bias")
    if isinstance(bias, dict) and bias:
        return sorted(int(k) for k in bias)
    if known is not None:
        return sorted(known)
    from ..registry import get_backend

    try:
        return sorted(get_backend("mlx-server").runner().vocab_model(target).vocab.eog)
    except Exception as exc:  # noqa: BLE001
        raise SpecviewError(f"no mlx_lm.server reproduction: ignore_eos bans the target's end-of-generation tokens, "
                            f"and its tokenizer ({target}) cannot be read here to name them ({exc})") from None


def _control_words(trace: Any) -> str:
    """What settles numerics against state on MLX, as the run's own serial-verify control measured it."""
    sv = obj(obj(trace.diagnosis).get("serial_verify"))
    same = sv.get("identical_to_vanilla")
    if same is True:
        return ("the run's serial-verify control (mlx-lm's speculative loop in process, every verify row computed as "
                "its own one-token pass) gave vanilla's tokens: the fork comes from the batched verify pass's "
                "numerics, not from the loop's state")
    if same is False:
        at = sv.get("first_mismatch")
        return ("the run's serial-verify control (mlx-lm's speculative loop in process, every verify row computed as "
                "its own one-token pass) still differed from vanilla" + (f" from token {at}" if at is not None else "")
                + ": the speculative loop or its cache is wrong (a state bug), or the backend is not deterministic")
    return ("the serial-verify control (mlx-lm's speculative loop in process, every verify row computed as its own "
            "one-token pass), which this run did not run: specview diagnose TRACE runs it; without it, the "
            "zero-draft answer and a fork that moves with num_draft_tokens are what can be checked")


def mlx_reproduction(trace: Any) -> MLXRepro:
    """The mlx_lm.server reproduction of an MLX-engine ``trace``; :class:`SpecviewError` saying why it cannot be."""
    from ..config import RunConfig

    cfg = obj(trace.config)
    backend = cfg.get("backend")
    if backend not in MLX_ENGINES:
        raise SpecviewError(f"no mlx_lm.server reproduction: the run used the {backend} engine")
    try:
        run = RunConfig.from_dict(cfg)
    except SpecviewError as exc:
        raise SpecviewError(f"no mlx_lm.server reproduction: the trace's settings are not a valid run ({exc})") from None
    if run.spec_type not in ("none", "draft-simple"):
        raise SpecviewError(f"no mlx_lm.server reproduction: mlx_lm.server speculates only with a draft model "
                            f"(--draft-model); the run used --spec-type {run.spec_type}, which it has no equivalent "
                            "of")
    from ..registry import get_backend

    process = protocol = get_backend("mlx-server").command_builders()  # the engine's own flag and request builders
    target, draft = _folders(trace, run)
    unmatched = unmatched_settings(run, backend)
    try:
        group = _group_size(trace, target) if process.kv_bits(run.engine.kv_type) else 64
        kv = process.kv_flags(run.engine.kv_type, group)
    except SpecviewError as exc:
        kv = []
        unmatched.append(f"kv_type {run.engine.kv_type}: {exc}; the servers keep the model's own dtype")
    extra = process.split_server_args(run.engine.server_args)
    num_draft = (0 if run.p_min >= 1.0 else int(run.n_max)) if draft else None
    servers = [MLXLaunch("vanilla", process.server_args(target, draft=None, n_batch=run.engine.n_batch, kv=kv,
                                                        extra=extra), PORTS["vanilla"])]
    if draft:
        argv = process.server_args(target, draft=draft, n_batch=run.engine.n_batch, kv=kv, extra=extra)
        servers.append(MLXLaunch("speculative", [*argv, "--num-draft-tokens", str(num_draft)], PORTS["speculative"]))
    text, chat, eog = _prompt(trace, run, target)
    ban = _ban(trace, target, eog) if run.ignore_eos else []
    endpoint, body = protocol.arm_request(text, chat=chat, max_tokens=run.max_tokens, top_logprobs=0, ban=ban)
    notes = []
    if backend == "mlx-server":
        who = "this run's own mlx_lm.server (the same flags, the same request, n_max sent per request)"
    else:
        who = "specview's in-process MLX engine (mlx-lm's models, specview's own speculative loop)"
        notes.append("the tokens above come from specview's own speculative loop on mlx-lm's models in its own "
                     "process; mlx_lm.server runs the same models and kernels, but its loop is mlx-lm's, so where it "
                     "drafts (and so where a fork can fall) may differ")
    if run.prompt_tokens:
        notes.append("the run was given token ids; mlx_lm.server reads text, so the request holds their text, "
                     "which the target's tokenizer turns back into exactly those ids")
    if cfg.get("stop_after_fork") is not None:
        notes.append(f"the run stopped its speculative arm {cfg['stop_after_fork']} tokens after the fork, so the "
                     "answers agree with it up to there")
    fm = trace.comparison.first_mismatch
    return MLXRepro(servers=servers, endpoint=endpoint, body=body, n_prompt=len(obj(trace.prompt).get("tokens") or []),
                    vanilla=list(trace.vanilla.tokens), speculative=list(trace.speculative.tokens),
                    fork=None if fm is None else fm.index, produced_by=who, num_draft_tokens=num_draft,
                    control=_control_words(trace), unmatched=unmatched, notes=notes)


# -- the Markdown ---------------------------------------------------------------------------------------------
#: compares two saved answers: the prompt each read, then the first token where they differ, or that they are equal
COMPARE_SCRIPT = """python3 - "$1" "$2" <<'EOF'
import json, sys
def read(f):
    r = json.load(open(f))
    return [e["id"] for e in r["choices"][0]["logprobs"]["content"]], r["usage"]["prompt_tokens"]
(a, pa), (b, pb) = (read(f) for f in sys.argv[1:3])
i = next((i for i, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y), None)
print(f"prompt {pa} and {pb} tokens;", f"identical over {len(a)} tokens" if i is None else
      f"fork at token {i}: {a[i:i + 1]} against {b[i:i + 1]}")
EOF"""


def compare_function() -> str:
    """A shell function ``same A.json B.json`` that prints where two mlx_lm.server answers' tokens first differ."""
    return "same() {\n" + COMPARE_SCRIPT + "\n}"


def control_command(request_file: str) -> str:
    """The one line that writes the control's request: ``request_file`` with ``num_draft_tokens`` 0."""
    return (f"python3 -c 'import json; b = json.load(open(\"{request_file}\")); b[\"num_draft_tokens\"] = 0; "
            f"json.dump(b, open(\"{CONTROL_FILE}\", \"w\"))'")


def _start(rp: MLXRepro) -> str:
    ports = " ".join(str(s.port) for s in rp.servers)
    return ("\n\n".join(s.line() + " &" for s in rp.servers) + f"\n\nfor p in {ports}; do until curl -sf "
            "http://127.0.0.1:$p/health > /dev/null; do sleep 1; done; done\n")


def mlx_repro_part(rp: MLXRepro, expected: str, *, request_file: str, inline_request: bool = True) -> str:
    """The reproduction section: servers, request, comparison, what each answer must hold, and the control."""
    chat = rp.endpoint.endswith("/chat/completions")
    out = ["### Reproduce without specview\n",
           "Start the servers (mlx-lm's `mlx_lm.server`, `pip install mlx-lm`; the model folders are this machine's; "
           "the first request to each loads its model, so it takes longer):\n", md_fence(_start(rp), "sh")]
    what = ("the prompt as the user message of a chat (the server applies the target's chat template)" if chat
            else "the prompt as text (the server tokenizes it)")
    req = json.dumps(rp.body, separators=(",", ":"))
    out.append(f"The request, greedy (temperature 0, top-k 1, top-p 1, no penalties), {what}, `max_tokens` "
               f"{rp.body['max_tokens']}, and `logprobs` with no top list, so each entry of an answer's "
               "`choices[0].logprobs.content` has the `id` of the token it emitted"
               + (", and the end-of-generation tokens banned (`logit_bias` -Infinity, as `ignore_eos`)"
                  if rp.body.get("logit_bias") else "") +
               f". mlx_lm.server reads no token ids: each answer's `usage.prompt_tokens` must be {rp.n_prompt}, the "
               f"trace's prompt. Save it as `{request_file}`"
               + (" (specview wrote it beside this report):" if inline_request else
                  ": specview wrote it beside this report; it is too long to paste here, attach it.") + "\n")
    if inline_request:
        out.append(md_fence(f"cat > {request_file} <<'EOF'\n{req}\nEOF", "sh"))
    lines = [rp.curl(arm, request_file, OUT_FILES[arm]) for arm in ("vanilla", "speculative")]
    where = ("Send it to both" if len(rp.servers) > 1 else
             "Send it twice (the run had no draft model: its second arm is a second request to the same server)")
    out.append(f"{where}, and compare the answers' tokens:\n")
    out.append(md_fence("\n".join(lines) + "\n\n" + compare_function() + "\nsame vanilla.json speculative.json", "sh"))
    out.append(expected)
    out.append(_control(rp, request_file))
    if rp.unmatched:
        out.append("Settings of this run mlx_lm.server has no equivalent of:\n")
        out.append("\n".join(f"- {md_text(u)}" for u in rp.unmatched) + "\n")
    if rp.notes:
        out.append("\n".join(f"- {md_text(n)}" for n in rp.notes) + "\n")
    return "\n".join(out)


def _control(rp: MLXRepro, request_file: str) -> str:
    head = ("**No `-ub 1` control.** mlx_lm.server has no equivalent of llama-server's `-ub 1`: no flag or request "
            "field makes it compute a verify pass's rows one at a time (`--prefill-step-size` chunks only the "
            "prompt; every verify pass is one batched forward pass over 1 + the drafted tokens).")
    if len(rp.servers) < 2:
        return head + f" What settles numerics against state instead: {md_text(rp.control)}.\n"
    lines = [control_command(request_file), rp.curl("speculative", CONTROL_FILE, OUT_FILES["zero-draft"]),
             f"same vanilla.json {OUT_FILES['zero-draft']}"]
    return "\n".join([
        head + " What it allows is the zero-draft control: the same request with `num_draft_tokens` 0 to the "
               "speculative server, whose draft model is loaded and whose speculative loop runs, but whose every "
               "pass computes one token:\n",
        md_fence("\n".join(lines), "sh"),
        ("It should print identical: if it does not, the speculative server is wrong even without a draft. It "
         "cannot tell batched numerics from a rollback bug, since with no draft nothing is ever rolled back; "
         "sending `num_draft_tokens` 1, 2, ... shows whether the fork follows the verify width. What settles it: "
         f"{md_text(rp.control)}.\n"),
    ])


__all__ = ["CONTROL_FILE", "MLX_ENGINES", "MLXLaunch", "MLXRepro", "OUT_FILES", "PORTS", "compare_function",
           "control_command", "mlx_repro_part", "mlx_reproduction", "unmatched_settings"]
