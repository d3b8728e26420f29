"""llama.cpp command lines for a run: llama-server, its requests, llama-cli.

One place builds them, from a trace's ``config`` block (or ``RunConfig.to_dict()``),
for every user of them: the report (the commands a maintainer pastes) and the
llama-server engine (the servers it starts).  So the servers specview starts and
the commands a report prints never disagree: the engine starts
``llama-server`` + :func:`server_argv` and adds only ``--host``/``--port`` (and
``--cache-ram 0`` where the binary has it, so no prompt state is restored
behind its back).  Flag names are llama.cpp's own (``common/arg.cpp``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping, Sequence

from .config import DRAFT_FILE_TYPES, DRAFT_PARAM_TYPES, settings_environment
from .errors import ConfigError

#: spec types whose drafter llama-server cannot run with ``-ub 1``, and llama.cpp's reason: the draft context
#: takes the server's micro-batch size (there is no draft-only one), and a non-causal drafter must see a whole
#: block in one micro-batch; the server aborts at start, in its 2-token probe of the draft context
UB1_REFUSED = {t: (f"{t}'s drafter is non-causal and shares the target's -ub, so llama.cpp aborts with -ub 1 "
                   "(GGML_ASSERT \"non-causal attention requires n_ubatch >= n_tokens\")")
               for t in ("draft-dflash", "draft-dspark")}

#: names llama.cpp removed (``common/arg.cpp``'s "removed params") and the flag that took their place
REMOVED_FLAGS = {
    "--draft-max": "--spec-draft-n-max", "--draft-n": "--spec-draft-n-max",
    "--draft-min": "--spec-draft-n-min", "--draft-n-min": "--spec-draft-n-min",
}
#: flags specview sets itself; giving them in ``server_args`` would contradict the run
RESERVED_SERVER_FLAGS = {
    "--host": "specview binds every server to 127.0.0.1",
    "--port": "specview picks free ports itself",
    "-m": "give the target as the run's target model", "--model": "give the target as the run's target model",
    "--spec-type": "give it as the run's spec type",
    "-md": "give the draft as the run's draft model", "--model-draft": "give the draft as the run's draft model",
    "--spec-draft-model": "give the draft as the run's draft model",
    "-np": "specview runs one slot per server", "--parallel": "specview runs one slot per server",
}
#: flags (other than ``--spec-*``) that configure only the drafter, so only the speculative server
SPEC_ONLY_FLAGS = frozenset({
    "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "-devd", "--device-draft", "-td", "--threads-draft",
    "-tbd", "--threads-batch-draft", "-ctkd", "--cache-type-k-draft", "-ctvd", "--cache-type-v-draft", "-otd",
    "--override-tensor-draft", "-cmoed", "--cpu-moe-draft", "-ncmoed", "--n-cpu-moe-draft", "-Cd", "--cpu-mask-draft",
    "-Crd", "--cpu-range-draft", "--cpu-strict-draft", "--prio-draft", "--poll-draft", "-Cbd",
    "--cpu-mask-batch-draft", "-Crbd", "--cpu-range-batch-draft", "--cpu-strict-batch-draft", "--prio-batch-draft",
    "--poll-batch-draft", "--draft-p-min", "--draft-p-split", "-hfd", "-hfrd", "--hf-repo-draft",
})


def _q(x: Any) -> str:
    return shlex.quote(str(x))


def _model_path(trace_models: Mapping[str, Any], role: str, config: Mapping[str, Any]) -> str:
    m = trace_models.get(role) or {}
    return str(m.get("path") or config.get(role) or f"{role.upper()}.gguf")


def ngl_text(n: Any) -> str:
    """specview's GPU-layer count as llama.cpp's ``-ngl`` value (-1 = "all")."""
    try:
        n = int(n)
    except (TypeError, ValueError):
        return "all"
    return "all" if n < 0 else str(n)


def uses_draft_file(spec_type: str | None) -> bool:
    return spec_type in DRAFT_FILE_TYPES


def context_size(config: Mapping[str, Any]) -> int:
    eng = config.get("engine") or {}
    return int(config.get("n_ctx_used") or eng.get("n_ctx") or 0) or 4096


def engine_flags(config: Mapping[str, Any]) -> list[str]:
    """Context flags: size, batch sizes, flash attention, offload, KV type, weight repacking and threads.

    The thread count is the one the run used (``threads_used``) when recorded,
    else the setting when it is not 0 ("every core", which llama.cpp decides itself).
    """
    eng = config.get("engine") or {}
    flags = ["-c", str(context_size(config)), "-b", str(eng.get("n_batch", 512)),
             "-ub", str(eng.get("n_ubatch", 512)), "-fa", str(eng.get("flash_attn", "auto")),
             "-ngl", ngl_text(eng.get("gpu_layers", -1))]
    kv = str(eng.get("kv_type") or "f16")
    flags += ["-ctk", kv, "-ctv", kv]
    if eng.get("no_repack") is True:  # weights in the plain CPU buffer (use_extra_bufts = false)
        flags.append("--no-repack")
    if eng.get("no_op_offload") is True:  # batches of weights in host memory stay on the CPU
        flags.append("--no-op-offload")
    threads = config.get("threads_used") or eng.get("threads") or 0
    if int(threads) > 0:
        flags += ["-t", str(int(threads))]
    return flags


def engine_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The environment llama.cpp needs for this run (ggml's start-up knobs, ``GGML_VK_*``): a server is started
    with it, and a command line shows it as a prefix (``GGML_VK_DISABLE_MMVQ=1 llama-server ...``)."""
    return settings_environment(config.get("engine") or {})


def env_prefix(config: Mapping[str, Any]) -> list[str]:
    return [f"{k}={v}" for k, v in engine_environment(config).items()]


def sampling_flags(config: Mapping[str, Any], *, eos: bool = True) -> list[str]:
    """Greedy sampling (requests set it again; on a command line it makes the server's default greedy).

    ``eos=False`` leaves ``--ignore-eos`` out: a server gets it per request, so
    one server serves runs with and without it.
    """
    flags = ["--temp", "0", "--top-k", "1"]
    if eos and config.get("ignore_eos"):
        flags.append("--ignore-eos")
    return flags


def spec_flags(config: Mapping[str, Any], draft_path: str | None) -> list[str]:
    """``--spec-type`` and the flags its type reads; ``-md`` for the types that load a draft file.

    ``draft_path`` is the draft file (None for types that need none).
    """
    eng = config.get("engine") or {}
    st = config.get("spec_type") or "draft-simple"
    if st == "none":
        return ["--spec-type", "none"]
    flags: list[str] = []
    if uses_draft_file(st):
        flags += ["-md", draft_path or "DRAFT.gguf", "-ngld", ngl_text(eng.get("gpu_layers", -1))]
    flags += ["--spec-type", st]
    if st in DRAFT_PARAM_TYPES:
        flags += ["--spec-draft-n-max", str(config.get("n_max", 3)),
                  "--spec-draft-n-min", str(config.get("n_min", 0)),
                  "--spec-draft-p-min", f"{float(config.get('p_min', 0.0)):g}"]
    elif st == "ngram-simple":
        flags += ["--spec-ngram-simple-size-n", str(config.get("ngram_size_n", 12)),
                  "--spec-ngram-simple-size-m", str(config.get("ngram_size_m", 48))]
    return flags


def _looks_like_value(tok: str) -> bool:
    if not tok.startswith("-"):
        return True
    try:
        float(tok)
        return True
    except ValueError:
        return False


def split_server_args(server_args: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Split the user's extra llama-server flags into (every server, the speculative server only).

    Flags named ``--spec-*`` and the draft model's own flags (``-ngld``,
    ``-devd``, ``-ctkd`` ...) go to the speculative server only, with their
    value; everything else goes to every server, verbatim.  Raises
    :class:`ConfigError` (setting ``server_args``) for flags specview sets itself.
    """
    if not server_args:
        return [], []
    try:
        toks = shlex.split(server_args) if isinstance(server_args, str) else [str(t) for t in server_args]
    except ValueError as exc:
        raise ConfigError(f"server_args: cannot split it into flags ({exc})", setting="server_args") from None
    both: list[str] = []
    spec: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        name = tok.split("=", 1)[0]
        if name in RESERVED_SERVER_FLAGS:
            raise ConfigError(f"server_args must not contain {name}: {RESERVED_SERVER_FLAGS[name]}",
                              setting="server_args")
        group = spec if (name.startswith("--spec-") or name in SPEC_ONLY_FLAGS) else both
        group.append(tok)
        i += 1
        if tok.startswith("-") and "=" not in tok and i < len(toks) and _looks_like_value(toks[i]):
            group.append(toks[i])
            i += 1
    return both, spec


def server_argv(config: Mapping[str, Any], *, target: str, draft: str | None = None, speculative: bool,
                ubatch: int | None = None) -> list[str]:
    """The flags of a llama-server for this run (without the program, ``--host`` and ``--port``).

    ``speculative`` adds the spec type's flags and the user's drafter-only
    ``server_args``; the user's other ``server_args`` go to every server, last,
    so they win over specview's own.  ``ubatch`` replaces ``-ub`` (the
    serial-verify control runs the same server with ``-ub 1``).
    """
    eng = dict(config.get("engine") or {})
    if ubatch is not None:
        eng["n_ubatch"] = int(ubatch)
    cfg = dict(config, engine=eng)
    both, spec_only = split_server_args(eng.get("server_args") or "")
    argv = ["-m", target, *engine_flags(cfg), *sampling_flags(cfg, eos=False)]
    if speculative:
        argv += spec_flags(cfg, draft)
    argv += ["-np", "1", *both]
    if speculative:
        argv += spec_only
    return argv


def _line(words: Sequence[str]) -> str:
    parts = [_q(w) if not w.startswith("-") or " " in w else w for w in words]
    out, cur = [], ""
    for p in parts:  # wrap long commands with backslashes, breaking before flags
        if cur and p.startswith("-") and len(cur) + len(p) > 72:
            out.append(cur + " \\")
            cur = "  " + p
        else:
            cur = f"{cur} {p}" if cur else p
    out.append(cur)
    return "\n".join(out)


def llama_commands(config: Mapping[str, Any], models: Mapping[str, Any], prompt: Mapping[str, Any]) -> dict[str, str]:
    """Equivalent llama.cpp commands for both arms (flag names as in llama.cpp's common/arg.cpp).

    Returns shell text for ``llama-server`` (vanilla and speculative: the same
    flags the llama-server engine starts its servers with), a ``curl`` request
    sending the exact prompt token ids, and ``llama-cli`` lines when the prompt
    is chat text.
    """
    target = _model_path(models, "target", config)
    st = config.get("spec_type") or "draft-simple"
    draft = _model_path(models, "draft", config) if uses_draft_file(st) else None
    n = int(config.get("max_tokens") or 256)
    try:
        vanilla_argv = server_argv(config, target=target, speculative=False)
        spec_argv = server_argv(config, target=target, draft=draft, speculative=True)
    except ConfigError:  # a trace with server flags specview would refuse: show the run without them
        bare = dict(config, engine=dict(config.get("engine") or {}, server_args=""))
        vanilla_argv = server_argv(bare, target=target, speculative=False)
        spec_argv = server_argv(bare, target=target, draft=draft, speculative=True)

    cmds: dict[str, str] = {}
    env = env_prefix(config)
    cmds["server_vanilla"] = _line([*env, "llama-server", *vanilla_argv, "--port", "8080"])
    cmds["server_speculative"] = _line([*env, "llama-server", *spec_argv, "--port", "8081"])
    body = {
        "prompt": [int(t) for t in prompt.get("tokens", [])],
        "n_predict": n,
        "temperature": 0,
        "top_k": 1,
        "cache_prompt": False,
        "return_tokens": True,
    }
    if config.get("ignore_eos"):
        body["ignore_eos"] = True
    payload = json.dumps(body, separators=(",", ":"))
    cmds["request"] = "\n".join(
        f"curl -s http://127.0.0.1:{port}/completion -H 'Content-Type: application/json' -d {_q(payload)} "
        f"> {name}.json" for port, name in ((8080, "vanilla"), (8081, "speculative"))
    ) + "\n# the two responses' \"tokens\" arrays must be equal\n" \
        "python3 -c 'import json; a,b=(json.load(open(f))[\"tokens\"] for f in (\"vanilla.json\",\"speculative.json\")); " \
        "print(\"identical\" if a==b else next(f\"fork at token {i}\" for i,(x,y) in enumerate(zip(a+[None],b+[None])) if x!=y))'"
    text = prompt.get("text")
    # llama-cli applies the chat template itself; a prompt without it (or raw ids) is only reproducible
    # through the server request above (llama-completion, which skips the template, has no --spec-* flags)
    if text is not None and not prompt.get("raw_tokens") and prompt.get("chat", True):
        base = [*env, "llama-cli", "-m", target, "-p", text, "-st", "-n", str(n), *engine_flags(config),
                *sampling_flags(config)]
        cmds["cli_vanilla"] = _line(base)
        cmds["cli_speculative"] = _line(base + spec_flags(config, draft))
    return cmds
