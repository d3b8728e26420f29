"""llama.cpp command lines for a run: llama-server, its requests, llama-cli.

One place builds them, from a trace's ``config`` block, for every user of
them: the report (the commands a maintainer pastes), ``specview run`` and the
llama-server engine (the servers it starts).  Flag names are llama.cpp's own
(``common/arg.cpp``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping, Sequence


def _q(x: Any) -> str:
    return shlex.quote(str(x))


def _model_path(trace_models: Mapping[str, Any], role: str, config: Mapping[str, Any]) -> str:
    m = trace_models.get(role) or {}
    return str(m.get("path") or config.get(role) or f"{role.upper()}.gguf")


def ngl_text(n: Any) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return "all"
    return "all" if n < 0 else str(n)


def llama_commands(config: Mapping[str, Any], models: Mapping[str, Any], prompt: Mapping[str, Any]) -> dict[str, str]:
    """Equivalent llama.cpp commands for both arms (flag names as in llama.cpp's common/arg.cpp).

    Returns shell text for ``llama-server`` (vanilla and speculative), a ``curl``
    request sending the exact prompt token ids, and ``llama-cli`` lines when the
    prompt is chat text.
    """
    eng = config.get("engine") or {}
    target = _model_path(models, "target", config)
    n = int(config.get("max_tokens") or 256)
    ctx = int(config.get("n_ctx_used") or eng.get("n_ctx") or 0) or 4096
    common = ["-c", str(ctx), "-b", str(eng.get("n_batch", 512)), "-ub", str(eng.get("n_ubatch", 512)),
              "-fa", str(eng.get("flash_attn", "auto")), "-ngl", ngl_text(eng.get("gpu_layers", -1))]
    kv = str(eng.get("kv_type") or "f16")
    common += ["-ctk", kv, "-ctv", kv]
    if int(eng.get("threads") or 0) > 0:
        common += ["-t", str(eng["threads"])]
    sampling = ["--temp", "0", "--top-k", "1"]
    if config.get("ignore_eos"):
        sampling.append("--ignore-eos")
    st = config.get("spec_type") or "draft-simple"
    spec: list[str] = []
    if st == "draft-simple":
        spec = ["-md", _model_path(models, "draft", config), "-ngld", ngl_text(eng.get("gpu_layers", -1)),
                "--spec-type", "draft-simple",
                "--spec-draft-n-max", str(config.get("n_max", 3)),
                "--spec-draft-n-min", str(config.get("n_min", 0)),
                "--spec-draft-p-min", f"{float(config.get('p_min', 0.0)):g}"]
    elif st == "ngram-simple":
        spec = ["--spec-type", "ngram-simple",
                "--spec-ngram-simple-size-n", str(config.get("ngram_size_n", 12)),
                "--spec-ngram-simple-size-m", str(config.get("ngram_size_m", 48))]
    elif st == "none":
        spec = ["--spec-type", "none"]

    def line(words: Sequence[str]) -> str:
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

    cmds: dict[str, str] = {}
    cmds["server_vanilla"] = line(["llama-server", "-m", target, *common, *sampling, "-np", "1", "--port", "8080"])
    cmds["server_speculative"] = line(["llama-server", "-m", target, *common, *sampling, *spec,
                                       "-np", "1", "--port", "8081"])
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
        base = ["llama-cli", "-m", target, "-p", text, "-st", "-n", str(n), *common, *sampling]
        cmds["cli_vanilla"] = line(base)
        cmds["cli_speculative"] = line(base + spec)
    return cmds
