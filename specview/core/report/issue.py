"""The body of an upstream issue: one Markdown paste with what "speculative decoding is not lossless" threads ask for.

The verdict and its proof, the op the verify pass departs at, the verify widths, both arms' token ids and text
around the fork, the build, the exact flags, each model's file, size and SHA-256, and a reproduction that needs no
specview (:mod:`.repro`): the llama-server command lines, the request, and the ``-ub 1`` control (for a run on
the MLX engines, :mod:`.repro_mlx`: the mlx_lm.server command lines, the request, and the zero-draft control).

GitHub refuses an issue body over 65,536 characters.  The body is built whole, then, while it is over
:data:`BUDGET`, the longest parts that can give way do (the full token lists, the prompt's text, the build's
long strings, the request's inline copy), each saying what it left out; what a maintainer needs to reproduce
the fork (the commands, the request file, the tokens through the fork) is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ... import __version__
from ..errors import SpecviewError
from .escape import md_code, md_fence, md_text, text, visible
from .facts import (
    acceptance_facts,
    config_facts,
    headline,
    obj,
    prompt_block,
    trace_title,
    verdict_facts,
)
from .repro import OUT_FILES, Repro, compare_function, reproduction

#: GitHub's limit on an issue body, in characters
LIMIT = 65536
#: what the body is kept under: the limit less a margin for characters GitHub counts twice (UTF-16 pairs)
BUDGET = LIMIT - 1536
#: tokens shown before and after the fork in its table
BEFORE, AFTER = 8, 8
#: tokens before the fork an answer's cut token list still shows
WINDOW = 64
#: the request file the reproduction sends (written beside the report)
REQUEST_FILE = "request.json"


def gh_length(s: str) -> int:
    """A text's length as GitHub counts it (UTF-16 code units: a character outside the BMP counts twice)."""
    return len(s.encode("utf-16-le")) // 2


@dataclass
class Part:
    """One section of the body; ``shrink`` gives a shorter version (saying what it left out), None when it cannot."""

    key: str
    body: str
    shrink: Callable[[], str] | None = None


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    out = ["| | |", "|---|---|"]
    out += [f"| {md_text(a)} | {md_code(b, table=True)} |" for a, b in rows]
    return "\n".join(out) + "\n"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, code: Sequence[int] = ()) -> str:
    """A table; the columns in ``code`` are shown literally (code spans), the others as escaped text."""
    out = ["| " + " | ".join(md_text(h) or " " for h in headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        cells = [md_code(text(v), table=True) if i in code else (md_text(text(v)) or " ") for i, v in enumerate(r)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# -- the parts ---------------------------------------------------------------------------------------------
def verdict_part(trace: Any) -> str:
    out = ["### Verdict and proof\n", f"**{md_text(headline(trace))}**\n"]
    d = obj(trace.diagnosis)
    if d.get("explanation"):
        out.append(md_text(d["explanation"]) + "\n")
    out.append(_kv(verdict_facts(trace)))
    sv = obj(d.get("serial_verify"))
    if sv:
        from ..diagnose import serial_line

        line = serial_line(sv)
        if line:
            out.append(f"Serial-verify control (every verify row as its own one-token pass): {md_code(line)}\n")
    ties = _ties(trace)
    if ties:
        from ..diagnose.ties import TABLE_HEADERS, intro, table_rows

        out.append("Near-tie density (how many positions were close enough to flip, and how many did): "
                   + md_text(intro(ties)) + "\n")
        out.append(_table(TABLE_HEADERS, table_rows(ties)))
    return "\n".join(out)


def _ties(trace: Any) -> dict[str, Any] | None:
    d = obj(trace.diagnosis).get("ties")
    if isinstance(d, dict) and d.get("bands"):
        return d
    try:
        from ..diagnose.ties import tie_density

        d = tie_density(trace)
    except Exception:  # noqa: BLE001 - an older trace the density cannot read: the report goes on without it
        return None
    return d if isinstance(d, dict) and d.get("bands") else None


def op_part(trace: Any) -> str:
    from ..diagnose import departure_line

    dep = obj(trace.diagnosis).get("departure")
    line = departure_line(dep) if dep else None
    if trace.comparison.identical:
        return "### The op\n\nNo fork, so nothing to locate.\n"
    if not line:
        return ("### The op\n\nNot located: the trace has no locate of the fork (`specview locate TRACE` walks the "
                "verify pass node by node against the single-token pass).\n")
    out = ["### The op\n", md_fence(line, "text")]
    d = obj(dep)
    rows = [(k, text(d.get(k))) for k in ("node", "op", "part", "weight_type", "weight_buffer", "computed_in",
                                          "max_abs", "width", "row", "position", "logits_differ")
            if d.get(k) is not None]
    if rows:
        out.append(_kv(rows))
    return "\n".join(out)


def width_rows(trace: Any) -> list[tuple[Any, ...]]:
    """Per verify width T of the speculative arm: rounds, drafted, accepted, acceptance, tokens it chose, the fork."""
    fm = trace.comparison.first_mismatch
    fork_w = None
    if fm is not None and fm.index < len(trace.speculative.steps):
        fork_w = trace.speculative.steps[fm.index].batch_size
    by: dict[int, list[Any]] = {}
    for r in trace.speculative.rounds:
        if r.index == 0:
            continue
        by.setdefault(r.batch_size, []).append(r)
    chosen: dict[int, int] = {}
    for st in trace.speculative.steps:
        if st.round and st.batch_size:
            chosen[st.batch_size] = chosen.get(st.batch_size, 0) + 1
    rows = []
    for w in sorted(by):
        rs = by[w]
        dr, ac = sum(r.drafted for r in rs), sum(r.accepted for r in rs)
        rows.append((w, len(rs), dr, ac, f"{ac / dr:.0%}" if dr else "n/a", chosen.get(w, 0),
                     "← the fork" if w == fork_w else ""))
    return rows


WIDTH_HEADERS = ("verify width T", "rounds", "drafted", "accepted", "acceptance", "tokens chosen", "")


def widths_part(trace: Any, kernel: Any = None) -> str:
    out = ["### Verify widths\n"]
    rows = width_rows(trace)
    if rows:
        out.append("The speculative arm's verify passes by width T (1 + drafted tokens): a width-dependent kernel "
                   "shows as a fork that follows one width.\n")
        out.append(_table(WIDTH_HEADERS, rows))
    else:
        out.append("The engine reported no verify rounds.\n")
    if kernel is not None and getattr(kernel, "table", None):
        from .kernels import WIDTH_HEADERS as MAP_HEADERS

        out.append(f"The kernel map's row {md_code(kernel.row_label)} (each width's rows against the single-token "
                   "pass):\n")
        out.append(_table(MAP_HEADERS, kernel.table))
        out.append(md_text(kernel.meaning) + "\n")
    return "\n".join(out)


def fork_rows(trace: Any) -> list[tuple[Any, ...]]:
    fm = trace.comparison.first_mismatch
    v, s = trace.vanilla.steps, trace.speculative.steps
    i = fm.index
    rows = []
    for j in range(max(0, i - BEFORE), i + AFTER + 1):
        vs = v[j] if j < len(v) else None
        ss = s[j] if j < len(s) else None
        if vs is None and ss is None:
            break
        where = ""
        if ss is not None and ss.batch_size is not None:
            where = f"{'draft' if ss.from_draft else 'target'}, row {ss.batch_index} of T={ss.batch_size}"
        rows.append(("→ " + str(j) if j == i else str(j),
                     "" if vs is None else vs.token, "" if vs is None else visible(vs.piece),
                     "" if ss is None else ss.token, "" if ss is None else visible(ss.piece),
                     "" if vs is None or vs.margin is None else f"{vs.margin:.4f}", where))
    return rows


def fork_part(trace: Any) -> str:
    fm = trace.comparison.first_mismatch
    if fm is None:
        return "### The fork\n\nNone: both arms produced the same tokens.\n"
    return "\n".join([
        f"### The fork, token {fm.index}\n",
        ("Both arms' token ids and text around it (the text of each token shown literally; ⏎ is a newline); the "
         "margin is vanilla's top-1 minus top-2 logit; the last column says which pass chose the speculative token.\n"),
        _table(("token", "vanilla id", "vanilla text", "speculative id", "speculative text", "vanilla margin",
                "speculative from"), fork_rows(trace), code=(2, 4)),
    ])


BUILD_KEYS = (
    ("specview", "specview"), ("llama-cpp-python", "llama_cpp_python"),
    ("llama.cpp vendored by it (commit)", "llama_cpp_vendored_commit"), ("ggml version", "ggml_version"),
    ("ggml commit (of this build)", "ggml_commit"), ("compiler", "compiler"), ("ggml backends", "ggml_backends"),
    ("GPU offload", "gpu_offload"), ("llama.cpp system info (CPU features)", "llama_cpp_system_info"),
    ("OS", "os"), ("platform", "platform"), ("CPU", "cpu"), ("Python", "python"),
)


#: what the run's setup facts say of GPUs (``specview doctor``'s facts, as the trace's ``environment.setup`` keeps them)
GPU_SETUP_KEYS = ("llama.cpp.gpu", "llama.cpp.software_device", "llama.cpp.offload", "llama.cpp.ggml_env",
                  "llama-server.devices")


def build_rows(trace: Any, *, long: int = 2000) -> list[tuple[str, str]]:
    """The build and machine, as the run recorded them; strings longer than ``long`` are cut, saying so."""
    env = obj(trace.environment)
    rows = []
    for label, k in BUILD_KEYS:
        v = env.get(k)
        if v in (None, "", []):
            continue
        s = ", ".join(text(x) for x in v) if isinstance(v, list) else text(v)
        rows.append((label, s if len(s) <= long else s[:long] + f"… (cut: {len(s)} characters)"))
    server = obj(obj(trace.extra).get("server"))
    ls = obj(env.get("llama_server"))
    ver = ls.get("version") or server.get("version")
    if ver:
        rows.insert(1, ("llama-server --version", text(ver)))
    if ls.get("binary"):
        rows.insert(2, ("llama-server binary", text(ls["binary"])))
    if ls.get("devices"):
        rows.insert(3, ("llama-server --list-devices", ", ".join(text(d) for d in ls["devices"])))
    for d in env.get("ggml_devices") or []:
        d = obj(d)
        desc = d.get("vulkan_line") or d.get("description") or d.get("type")
        mem = f", {d['memory_mib']} MiB" if d.get("memory_mib") else ""
        rows.append((f"device {text(d.get('name'))}", f"{text(desc)}{mem}"))
    setup = obj(env.get("setup"))
    for k in sorted(setup):
        wanted = k.startswith(("machine.", "vulkan.", "gpu.")) or k in GPU_SETUP_KEYS
        if wanted and k not in ("machine.cpu", "machine.os") and setup[k] not in (None, "", []):
            rows.append((k, text(setup[k])[:long]))
    for k, v in sorted(obj(env.get("ggml_env")).items()):
        rows.append((f"environment {k}", text(v)))
    return rows


def build_part(trace: Any, long: int = 2000) -> str:
    return "### Build and machine\n\n" + _kv(build_rows(trace, long=long))


def model_rows(trace: Any) -> list[tuple[str, ...]]:
    block = obj(obj(trace.config).get("models"))
    rows = []
    for role in ("target", "draft"):
        m, rec = obj(trace.models.get(role)), obj(block.get(role))
        if not m and not rec:
            continue
        size = m.get("file_size", rec.get("size"))
        rows.append((role, text(m.get("file") or rec.get("path")), text(m.get("quantization")),
                     text(size) if size is not None else "n/a", text(rec.get("sha256") or m.get("sha256") or "n/a"),
                     text(rec.get("name") or "")))
    return rows


def models_part(trace: Any) -> str:
    return "### Models\n\n" + _table(("role", "file", "quantization", "bytes", "sha256", "named"), model_rows(trace),
                                      code=(1, 4, 5))


def flags_part(trace: Any) -> str:
    return "\n".join(["### Settings\n", _kv(config_facts(trace)), "Acceptance and speed:\n",
                      _kv(acceptance_facts(trace))])


def _ids(tokens: Sequence[int]) -> str:
    return " ".join(str(t) for t in tokens)


def repro_part(trace: Any, rp: Repro, *, inline_request: bool = True, full_tokens: bool = True) -> str:
    """The reproduction: servers, request, comparison and what each answer must hold (mlx_lm.server's for a run on
    the MLX engines, :mod:`.repro_mlx`)."""
    from .repro_mlx import MLXRepro, mlx_repro_part

    if isinstance(rp, MLXRepro):
        return mlx_repro_part(rp, _expected(rp, full_tokens), request_file=REQUEST_FILE, inline_request=inline_request)
    out = ["### Reproduce without specview\n",
           "Start the servers (any llama.cpp build with `--spec-type`; the model paths are this machine's):\n"]
    main = [s for s in rp.servers if "-ub 1" not in s.name]
    out.append(md_fence(_start(main), "sh"))
    req = json.dumps(rp.body, separators=(",", ":"))
    out.append(f"The request, greedy (temperature 0, top-k 1, every other sampler off), the prompt as "
               f"{len(rp.body['prompt'])} token ids, `n_predict` {rp.body['n_predict']} and the speculative settings "
               f"(`speculative.*`, read per request by builds that take them; the command line sets the same). "
               f"Save it as `{REQUEST_FILE}`" + (" (specview wrote it beside this report):" if inline_request else
                                                 ": specview wrote it beside this report; it is too long to paste "
                                                 "here, attach it.") + "\n")
    if inline_request:
        out.append(md_fence(f"cat > {REQUEST_FILE} <<'EOF'\n{req}\nEOF", "sh"))
    lines = [f"curl -s http://127.0.0.1:{s.port}/completion -H 'Content-Type: application/json' "
             f"-d @{REQUEST_FILE} > {OUT_FILES[s.name]}" for s in main]
    out.append("Send it to both, and compare the answers' `tokens`:\n")
    out.append(md_fence("\n".join(lines) + "\n\n" + compare_function() + "\nsame vanilla.json speculative.json", "sh"))
    out.append(_expected(rp, full_tokens))
    out.append(_control(rp))
    if rp.notes:
        out.append("\n".join(f"- {md_text(n)}" for n in rp.notes) + "\n")
    return "\n".join(out)


def _expected(rp: Repro, full: bool) -> str:
    n_v, n_s = len(rp.vanilla), len(rp.speculative)
    head = (f"What this run gave, on {md_text(rp.produced_by)}: " +
            (f"`same` prints **fork at token {rp.fork}**." if rp.fork is not None else "`same` prints identical."))
    if full:
        body = f"vanilla ({n_v} tokens):\n{_ids(rp.vanilla)}\n\nspeculative ({n_s} tokens):\n{_ids(rp.speculative)}"
        note = "Both answers' `tokens`, in full:\n"
    else:
        f = rp.fork if rp.fork is not None else 0
        lo, hi = max(0, f - WINDOW), f + AFTER + 1
        body = "\n\n".join(f"{name}, tokens {lo}-{min(hi, len(toks)) - 1} of {len(toks)}:\n{_ids(toks[lo:hi])}"
                             for name, toks in (("vanilla", rp.vanilla), ("speculative", rp.speculative)))
        note = (f"Both answers' `tokens` from {WINDOW} tokens before the fork to {AFTER} after it (the rest is cut "
                "to keep this issue under GitHub's 65,536 characters; the full lists are in the trace):\n")
    return "\n".join([head + "\n", note, md_fence(body, "text")])


def _control(rp: Repro) -> str:
    ub = [s for s in rp.servers if "-ub 1" in s.name]
    if not ub:
        return f"The `-ub 1` control cannot run for this drafter: {md_text(rp.ub1_refused)}.\n"
    lines = [_start(ub)]
    lines += [f"curl -s http://127.0.0.1:{s.port}/completion -H 'Content-Type: application/json' "
              f"-d @{REQUEST_FILE} > {OUT_FILES[s.name]}" for s in ub]
    lines.append("same vanilla-ub1.json speculative-ub1.json")
    return "\n".join([("**The `-ub 1` control.** The same two servers with `-ub 1`: every pass computes one token, "
                       "so each verify row is computed as plain decoding computes it:\n"),
                      md_fence("\n".join(lines), "sh"), f"What it shows: {md_text(rp.control)}.\n"])


def _start(servers: Sequence[Any]) -> str:
    """The servers' command lines, each in the background, then a wait until every one answers /health."""
    ports = " ".join(str(s.port) for s in servers)
    return ("\n\n".join(s.line() + " &" for s in servers) + f"\n\nfor p in {ports}; do until curl -sf "
            "http://127.0.0.1:$p/health > /dev/null; do sleep 1; done; done\n")


def _text_request(trace: Any) -> bool:
    """Whether the reproduction's request sends the prompt as text (mlx_lm.server reads no token ids)."""
    from .repro_mlx import MLX_ENGINES

    return obj(trace.config).get("backend") in MLX_ENGINES


def prompt_part(trace: Any, limit: int | None = None) -> str:
    label, body = prompt_block(trace)
    cut = ""
    if limit is not None and len(body) > limit:
        held = "the whole text" if _text_request(trace) else "the exact token ids"
        cut = f"\n\n(cut at {limit} of {len(body)} characters; the request above holds {held})"
        body = body[:limit]
    return "\n".join(["<details><summary>Prompt</summary>\n", md_text(label) + "\n", md_fence(body, "text"),
                      (md_text(cut.strip()) + "\n" if cut else "") + "</details>\n"])


# -- the body ---------------------------------------------------------------------------------------------
def issue_parts(trace: Any, rp: Repro | None, why_not: str | None, kernel: Any = None) -> list[Part]:
    title = (f"Greedy speculative decoding matched plain greedy: {trace_title(trace)}" if trace.comparison.identical
             else f"Greedy speculative decoding is not lossless: {trace_title(trace)}")
    parts = [Part("title", f"## {md_text(title)}\n"), Part("verdict", verdict_part(trace)),
             Part("op", op_part(trace)), Part("widths", widths_part(trace, kernel)), Part("fork", fork_part(trace)),
             Part("build", build_part(trace), lambda: build_part(trace, long=200)),
             Part("flags", flags_part(trace)), Part("models", models_part(trace))]
    if rp is not None:
        parts.append(Part("repro", repro_part(trace, rp),
                          lambda: repro_part(trace, rp, full_tokens=False)))
    else:
        parts.append(Part("repro", f"### Reproduce without specview\n\n{md_text(why_not)}.\n"))
    parts.append(Part("prompt", prompt_part(trace), lambda: prompt_part(trace, limit=2000)))
    parts.append(Part("footer", f"<sub>Made with specview {md_text(obj(trace.environment).get('specview', __version__))}"
                                f" (`specview report --issue`).</sub>\n"))
    return parts


def _join(parts: list[Part]) -> str:
    return "\n".join(p.body for p in parts if p.body)


def issue_markdown(trace: Any, *, kernel: Any = None, budget: int = BUDGET) -> tuple[str, list[str]]:
    """(the issue body, what was cut to fit it under ``budget``)."""
    try:
        rp, why = reproduction(trace), None
    except SpecviewError as exc:
        rp, why = None, str(exc)
    parts = issue_parts(trace, rp, why, kernel)
    cut: list[str] = []
    order = ["repro", "prompt", "build"]
    for key in order:
        if gh_length(_join(parts)) <= budget:
            break
        p = next(x for x in parts if x.key == key)
        if p.shrink is not None:
            p.body, p.shrink = p.shrink(), None
            cut.append(key)
    if rp is not None and gh_length(_join(parts)) > budget:  # the request itself is too long to paste
        p = next(x for x in parts if x.key == "repro")
        p.body = repro_part(trace, rp, inline_request=False, full_tokens=False)
        cut.append("request")
    while gh_length(_join(parts)) > budget:  # what is left: drop whole sections from the least needed up
        drop = next((x for x in parts if x.key in ("prompt", "flags", "build", "widths", "op") and x.key not in cut),
                    None)
        if drop is None:
            break
        drop.body = f"### {drop.key.title()}\n\n(left out: this issue would be over GitHub's 65,536 characters)\n"
        cut.append(drop.key)
    if cut:
        words = dict(_CUT_WORDS, **({"prompt": "the prompt's text (the request holds it whole)"}
                                    if _text_request(trace) else {}))
        note = ("> **Note:** cut to stay under GitHub's 65,536-character limit: "
                + md_text(", ".join(words.get(c, c) for c in cut)) + ".\n")
        parts.insert(1, Part("note", note))
    body = _join(parts)
    if gh_length(body) > LIMIT:
        raise SpecviewError(f"the issue body is {gh_length(body)} characters even cut down, over GitHub's {LIMIT}")
    return body, cut


_CUT_WORDS = {"repro": "the full token lists (kept around the fork)", "prompt": "the prompt's text (the request "
              "holds its token ids)", "build": "long build strings", "request": "the request's inline copy (attach "
              f"{REQUEST_FILE})"}


__all__ = [
    "BUDGET",
    "LIMIT",
    "REQUEST_FILE",
    "build_rows",
    "fork_rows",
    "gh_length",
    "issue_markdown",
    "model_rows",
    "width_rows",
]
