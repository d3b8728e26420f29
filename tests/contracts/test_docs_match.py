"""The README and docs/ against the code: every flag they give a specview command exists in that command's
real argparse parser, and every top-level and environment key docs/trace-format.md names is in a real trace
(written here by a tiny llama.cpp model) or is listed below as written only by some engines or runs.

What is checked as a specview command line: a code line or inline code span that starts with ``specview CMD``
(the rest of the line up to a comment), and the inline code spans of a paragraph that says "`specview CMD`
takes".  Flags of other programs (llama-server's, pip's, cmake's) are never attributed to specview.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specview import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: top-level trace keys some engines or runs write, and a tiny llama.cpp run does not
OPTIONAL_TOP = {
    "server": "the llama-server and mlx_lm.server engines only",
    "crash": "only when the engine's process died during the run",
}
#: environment keys of other engines, or of a run whose setup facts failed
OPTIONAL_ENV = {
    "setup_error": "only when a setup fact could not be read",
    "mlx": "the mlx engine", "mlx_lm": "the mlx engine", "mlx_device": "the mlx engine",
    "engine": "the llama-server engine", "llama_server": "the llama-server engine",
    "llama_lib_dir": "the llama.cpp engine of a build that records where its library was loaded from",
    "ggml_env": "the llama.cpp engine of a build that records its ggml start-up variables",
}

#: long flags the docs give other programs (llama-server, mlx_lm.server, pip, llama.cpp's tools, vulkaninfo, the
#: benchmark scripts); any other ``--flag`` in a doc's code must be one of specview's
FOREIGN = {
    "llama-server": {"--cache-ram", "--host", "--port", "--spec-", "--list-devices", "--no-kv-unified",
                     "--spec-ngram-map-k-size-n", "--spec-ngram-mod-n-match"},
    "mlx_lm.server / mlx-lm": {"--chat-template-args", "--draft-model", "--kv-", "--kv-bits", "--kv-group-size",
                               "--num-draft-tokens", "--prefill-step-size", "--prompt-cache-size",
                               "--quantized-kv-start", "--trust-remote-code"},
    "pip": {"--force-reinstall", "--no-cache-dir", "--no-binary", "--no-deps"},
    "pytest (pytest-xdist)": {"--dist", "--junitxml"},
    "llama-perplexity": {"--kl-divergence"},
    "vulkaninfo": {"--summary"},
    "the build, bench and mutation-check scripts": {"--force", "--table", "--size", "--jobs"},
}

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def parsers() -> dict[str, argparse.ArgumentParser]:
    top = cli.build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p for name, p in sub.choices.items()}


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def command_uses(text: str) -> list[tuple[str, str, str]]:
    """(command, the text its flags are read from, where) for every specview command line of a document."""
    out = []
    cmd_re = r"(?:specview|dist/specview/specview) ([a-z]+)"
    fenced = False
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()  # continuation lines joined
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:  # a command line in a code block: the flags up to a comment
            m = re.match(rf"\s*(?:\$\s*)?{cmd_re}([^#]*)", line)
            if m:
                out.append((m.group(1), m.group(2), f"line {n}: {line.strip()[:90]}"))
            continue
        for m in re.finditer(rf"`{cmd_re}([^`]*)`", line):  # an inline span
            out.append((m.group(1), m.group(2), f"line {n}: {m.group(0)[:90]}"))
    # "`specview CMD` takes `--a`, `--b` ..." paragraphs
    for para in re.split(r"\n\s*\n", text):
        m = re.search(r"`specview ([a-z]+)` takes", para)
        if m:
            spans = " ".join(re.findall(r"`([^`]+)`", para[m.end():]))
            out.append((m.group(1), spans, f"the paragraph '{para.strip()[:60]}…'"))
    return out


def flags_in(s: str) -> list[str]:
    return [f for part in s.replace("/", " ").split() for f in FLAG.findall(part)]


def test_every_flag_the_docs_give_a_command_exists_in_its_parser():
    ps = parsers()
    bad, seen = [], 0
    for doc in DOCS:
        for cmd, rest, where in command_uses(doc.read_text(encoding="utf-8")):
            if cmd not in ps:
                if cmd in cli.COMMANDS:  # a command whose module did not load: its own tests say why
                    continue
                bad.append(f"{doc.name} {where}: there is no `specview {cmd}` command")
                continue
            known = options(ps[cmd])
            for flag in flags_in(rest):
                flag = flag.split("=")[0]
                seen += 1
                if flag not in known:
                    bad.append(f"{doc.name} {where}: `specview {cmd}` has no {flag}")
    assert seen > 100, f"only {seen} flags found in the docs: the reader above no longer finds them"
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_renamed_flag():
    """The check itself on a planted drift: a flag the parser does not have, and one it has."""
    ps = parsers()
    uses = command_uses("Run `specview run --n-max 4 --max-draft 4` or:\n\n```\nspecview check -m x.gguf --kl 1\n```\n")
    missing = [(c, f) for c, rest, _ in uses for f in flags_in(rest) if f not in options(ps[c])]
    assert missing == [("run", "--max-draft"), ("check", "--kl")]


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"docs/trace-format.md has no '## {heading}' section"
    return m.group(1)


def _first_column_keys(section: str) -> set[str]:
    keys = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([a-z_][a-z0-9_]*)`", line.split("|")[1]))
    return keys


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory, tiny_target, tiny_draft) -> dict:
    out = tmp_path_factory.mktemp("trace") / "t.json"
    cp = subprocess.run([sys.executable, "-m", "specview", "run", "-m", str(tiny_target), "-md", str(tiny_draft),
                         "-p", "the cat sat on the", "--no-chat", "--ignore-eos", "-n", "16", "-t", "1",
                         "--json", str(out), "-q"], capture_output=True, text=True, timeout=300)
    assert cp.returncode in (0, 1), cp.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def test_every_top_level_and_environment_key_of_the_format_is_in_a_real_trace(tiny_trace):
    text = (ROOT / "docs" / "trace-format.md").read_text(encoding="utf-8")
    top = _first_column_keys(_section(text, "Top level"))
    env = _first_column_keys(_section(text, "`environment`"))
    assert {"schema", "config", "vanilla"} <= top and {"specview", "cpu", "gpu_offload"} <= env  # the reader works
    assert not (top - set(tiny_trace) - set(OPTIONAL_TOP)), "documented, not written: " + \
        ", ".join(sorted(top - set(tiny_trace) - set(OPTIONAL_TOP)))
    env_now = set(tiny_trace["environment"])
    assert not (env - env_now - set(OPTIONAL_ENV)), "documented, not written: " + \
        ", ".join(sorted(env - env_now - set(OPTIONAL_ENV)))
    # and the other way: what a trace writes is documented
    assert not (set(tiny_trace) - top), "written, not documented: " + ", ".join(sorted(set(tiny_trace) - top))
    assert not (env_now - env), "written, not documented: " + ", ".join(sorted(env_now - env))
    # the optional keys are named in the format too (a key listed here but documented nowhere is a typo)
    assert set(OPTIONAL_TOP) <= top and set(OPTIONAL_ENV) <= env


def test_every_long_flag_in_the_docs_code_is_specviews_or_a_named_other_programs():
    """A flag named in prose (`--stop-at-difference`, which prescribe uses) is checked too, against every command."""
    top = cli.build_parser()
    known = options(top).union(*(options(p) for p in parsers().values()))
    foreign = set().union(*FOREIGN.values())
    assert not foreign & known, "a flag listed as another program's is specview's: " + ", ".join(foreign & known)
    bad = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")):
            for f in FLAG.findall(span):
                if f.startswith("--") and f.split("=")[0] not in known | foreign:
                    bad.append(f"{doc.name}: {f} (in `{span[:70]}`)")
    assert not bad, "flags no specview command has:\n" + "\n".join(sorted(set(bad)))
