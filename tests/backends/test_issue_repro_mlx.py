"""The mlx_lm.server reproduction of ``specview report --issue`` for runs on the MLX engines.

A run on the mlx-server engine (the demo MLX folders, the real ``mlx_lm.server``), reported with ``--issue``; then
the report's own shell blocks are read back (CommonMark fences, shell words) and run as written: the server lines
started with ``subprocess`` (only the port changed, to a free one), the heredoc, the curl lines, the control and the
``same`` comparisons run by bash with the real curl and python3.  The answers must hold the tokens and text of the
trace's arms, and fork where the trace forks.  A unit test reads the Markdown of an in-process ``mlx`` trace.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.request

import pytest
from pasted import free_port, sh_blocks, start_server, stop_servers, wait_healthy

from specview import cli
from specview.core.arms.compare import compare_arms
from specview.core.errors import SpecviewError
from specview.core.report.escape import md_text
from specview.core.report.issue import LIMIT, gh_length, issue_markdown
from specview.core.report.repro import reproduction
from specview.core.trace import ArmResult, Step, Trace

PROMPT = "Name three colours of the rainbow."


# -- the Markdown, read back ------------------------------------------------------------------------------------
def server_lines(body: str) -> list[list[str]]:
    out = []
    for block in sh_blocks(body):
        for ln in block.replace("\\\n", " ").splitlines():
            words = shlex.split(ln)
            if "mlx_lm.server" in words:
                out.append([w for w in words if w != "&"])
    return out


def heredoc_request(body: str) -> dict:
    for block in sh_blocks(body):
        m = re.search(r"cat > request\.json <<'EOF'\n(.*)\nEOF", block, re.DOTALL)
        if m:
            return json.loads(m.group(1))
    raise AssertionError("the report pastes no request")


def flag(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def answer(name: str, ids: list[int], prompt_tokens: int = 5) -> dict:
    """An answer in mlx_lm.server's shape (logprobs true, no top list)."""
    return {"choices": [{"logprobs": {"content": [{"id": t, "logprob": -0.1} for t in ids]}}],
            "usage": {"prompt_tokens": prompt_tokens}, "name": name}


# -- an in-process mlx trace ------------------------------------------------------------------------------------
def mlx_trace(*, n: int = 12, fork: int = 7, **cfg_kw) -> Trace:
    vt = [300 + i for i in range(n)]
    st = vt[:fork] + [9] + vt[fork + 1:]

    def steps(toks):
        return [Step(index=i, token=t, piece=f" w{t}", pos=5 + i, top_ids=[t, t + 1], top_logits=[2.0, 1.9],
                     margin=0.1, round=None, from_draft=None, batch_size=None, batch_index=None)
                for i, t in enumerate(toks)]

    v = ArmResult("vanilla", vt, "", steps(vt), [], 1.0, 10.0, 9.0, "max_tokens")
    s = ArmResult("speculative", st, "", steps(st), [], 1.0, 10.0, 9.0, "max_tokens", "draft-simple")
    config = {"target": "/m/target-mlx", "draft": "/m/draft-mlx", "spec_type": "draft-simple", "n_max": 3,
              "n_min": 1, "p_min": 0.5, "max_tokens": n, "prompt": PROMPT, "prompt_tokens": None, "chat": True,
              "ignore_eos": False, "top_k": 8, "backend": "mlx",
              "engine": {"n_batch": 256, "threads": 4, "kv_type": "f16", "rollback": "auto"}}
    config.update(cfg_kw)
    return Trace(config=config, environment={"specview": "0.1.0", "backend": "mlx"},
                 models={"target": {"path": "/m/target-mlx", "file": "target-mlx"},
                         "draft": {"path": "/m/draft-mlx", "file": "draft-mlx"}},
                 prompt={"text": PROMPT, "chat": True, "raw_tokens": False, "tokens": [1, 2, 3, 4, 5]},
                 vanilla=v, speculative=s, comparison=compare_arms(v, s),
                 diagnosis={"verdict": "near-tie", "serial_verify": {"identical_to_vanilla": True, "n_tokens": n}})


def test_the_markdown_of_an_in_process_mlx_trace(tmp_path):
    t = mlx_trace()
    body, cut = issue_markdown(t)
    assert not cut and gh_length(body) <= LIMIT
    vanilla, spec = server_lines(body)
    # the servers: mlx_lm.server on the trace's folders, its n_batch as the prefill step, n_max as the draft count
    assert vanilla[:2] == ["HF_HUB_OFFLINE=1", "mlx_lm.server"] and spec[1] == "mlx_lm.server"
    assert flag(vanilla, "--model") == flag(spec, "--model") == "/m/target-mlx"
    assert "--draft-model" not in vanilla and flag(spec, "--draft-model") == "/m/draft-mlx"
    assert flag(spec, "--num-draft-tokens") == "3" and "--num-draft-tokens" not in vanilla
    assert flag(vanilla, "--prefill-step-size") == flag(spec, "--prefill-step-size") == "256"
    assert flag(vanilla, "--prompt-cache-size") == "0" and flag(spec, "--host") == "127.0.0.1"
    assert {flag(vanilla, "--port"), flag(spec, "--port")} == {"8080", "8081"}
    # the request: the chat prompt as text, greedy, ids in the answer; one request for both servers
    req = heredoc_request(body)
    assert req["messages"] == [{"role": "user", "content": PROMPT}] and req["max_tokens"] == 12
    assert req["temperature"] == 0.0 and req["top_k"] == 1 and req["logprobs"] is True and req["top_logprobs"] == 0
    assert "num_draft_tokens" not in req and "logit_bias" not in req and "prompt" not in req
    assert reproduction(t).body == req  # what specview writes as request.json
    assert body.count("/v1/chat/completions -H") == 3  # vanilla, speculative, the zero-draft control
    # no -ub 1, said plainly, and the control it allows instead, with what the run's serial control showed
    assert "mlx_lm.server has no equivalent of llama-server's `-ub 1`" in body
    assert "num_draft_tokens` 0" in body and "gave vanilla's tokens" in body
    # the settings it has no equivalent of, by name
    tail = body[body.index("no equivalent of:"):]
    assert "n\\_min 1" in tail and "p\\_min 0.5" in tail and "threads 4" in tail
    assert "in-process MLX engine" in body and "fork at token 7" in body
    assert f"vanilla (12 tokens):\n{' '.join(map(str, t.vanilla.tokens))}" in body
    # the report's own `same` reads answers in mlx_lm.server's shape and finds the fork
    (tmp_path / "vanilla.json").write_text(json.dumps(answer("v", t.vanilla.tokens)))
    (tmp_path / "speculative.json").write_text(json.dumps(answer("s", t.speculative.tokens)))
    (tmp_path / "request.json").write_text(json.dumps(req))
    block = next(b for b in sh_blocks(body) if "same() {" in b)
    script = block[block.index("same() {"):]
    ctl = next(b for b in sh_blocks(body) if "request-0draft.json" in b).splitlines()[0]
    cp = subprocess.run(["bash", "-c", script + "\n" + ctl], cwd=tmp_path, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "prompt 5 and 5 tokens; fork at token 7: [307] against [9]"
    assert json.loads((tmp_path / "request-0draft.json").read_text()) == {**req, "num_draft_tokens": 0}


def test_what_mlx_lm_server_cannot_redo_is_named():
    t = mlx_trace(spec_type="ngram-simple", draft=None)
    with pytest.raises(SpecviewError, match="--spec-type ngram-simple"):
        reproduction(t)
    body, _ = issue_markdown(t)
    assert "no mlx\\_lm.server reproduction" in body and "ngram-simple" in body
    # p_min 1 is the zero-draft control: the speculative server drafts none, and nothing is left unmatched
    rp = reproduction(mlx_trace(p_min=1.0, n_min=0, engine={"n_batch": 512}))
    assert rp.servers[1].argv[-2:] == ["--num-draft-tokens", "0"] and rp.unmatched == []


# -- a run on the real mlx_lm.server, and the report's commands run as written --------------------------------------
def report(t: Trace, d) -> tuple[Trace, str, str]:
    """(the saved trace read back, its issue's Markdown, the request.json specview wrote beside it)."""
    d.mkdir(exist_ok=True)
    t.save(d / "run.json")
    assert cli.main(["report", str(d / "run.json"), "--issue", "-o", str(d / "out")]) == 0
    return (Trace.load(d / "run.json"), (d / "out" / "report-issue.md").read_text(encoding="utf-8"),
            (d / "out" / "request.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A demo run on the real mlx_lm.server, reported."""
    pytest.importorskip("mlx_lm")
    from specview.core.config import RunConfig
    from specview.core.registry import get_backend

    cfg = RunConfig(backend="mlx-server", max_tokens=20, prompt=PROMPT, ignore_eos=True, n_max=3)
    with get_backend("mlx-server").runner() as runner:
        t = runner.run(cfg)
        runner.diagnose(t, cfg)
    return report(t, tmp_path_factory.mktemp("issue-mlx"))


def run_commands(body: str, cwd, program: str | None = None) -> tuple[dict[str, dict], list[str]]:
    """The report's commands run as written: its servers (on free ports; ``program`` for ``mlx_lm.server`` if
    given), then every other shell block by bash; (the answers saved, by file stem; what the ``same`` lines
    printed)."""
    ports, procs = {}, []
    try:
        for words in server_lines(body):
            env = dict(os.environ)
            while "=" in words[0]:
                k, _, v = words.pop(0).partition("=")
                env[k] = v
            if program:
                words[0] = program
            i = words.index("--port")
            ports[words[i + 1]] = str(free_port())
            words[i + 1] = ports[words[i + 1]]
            procs.append(start_server(words, env))
        assert len(procs) == 2
        wait_healthy(procs, ports.values(), what="mlx_lm.server", seconds=300, poll=0.5)
        script = "\n".join(b for b in sh_blocks(body) if "mlx_lm.server" not in b)
        for old, new in ports.items():
            script = script.replace(f"127.0.0.1:{old}/", f"127.0.0.1:{new}/")
        cp = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=900)
        assert cp.returncode == 0, cp.stderr
    finally:
        stop_servers(procs)
    got = {name: json.loads((cwd / f"{name}.json").read_text())
           for name in ("vanilla", "speculative", "speculative-0draft")}
    return got, cp.stdout.strip().splitlines()


def ids(a: dict) -> list[int]:
    return [e["id"] for e in a["choices"][0]["logprobs"]["content"]]


def check_answers(t: Trace, body: str, got: dict[str, dict], lines: list[str], *, chat: bool) -> None:
    """The answers hold the trace's arms, token by token and as text, and fork where it does, as ``same`` says."""
    n = len(t.prompt["tokens"])
    assert all(a["usage"]["prompt_tokens"] == n for a in got.values())
    assert ids(got["vanilla"]) == t.vanilla.tokens and ids(got["speculative"]) == t.speculative.tokens

    def text(a):
        c = a["choices"][0]
        return c["message"]["content"] if chat else c["text"]

    assert text(got["vanilla"]) == t.vanilla.text and text(got["speculative"]) == t.speculative.text
    fm = t.comparison.first_mismatch
    if fm is None:
        assert lines[0] == f"prompt {n} and {n} tokens; identical over {len(t.vanilla.tokens)} tokens"
        assert "`same` prints identical" in body
    else:
        assert lines[0].startswith(f"prompt {n} and {n} tokens; fork at token {fm.index}:")
        assert f"`same` prints **fork at token {fm.index}**" in body
    # the zero-draft control: every pass one token, so it gives vanilla's tokens, as the report says it should
    assert ids(got["speculative-0draft"]) == t.vanilla.tokens
    assert lines[1] == f"prompt {n} and {n} tokens; identical over {len(t.vanilla.tokens)} tokens"


@pytest.mark.demo
@pytest.mark.decides_nothing
@pytest.mark.slow
def test_the_reports_mlx_lm_server_commands_give_the_trace(reported, tmp_path):
    t, body, request = reported
    assert not t.config.get("decided"), t.config.get("decided")  # the same run on every CPU
    assert gh_length(body) <= LIMIT
    assert heredoc_request(body) == json.loads(request)
    assert json.loads(request)["logit_bias"]  # ignore_eos: the target's end-of-generation tokens banned
    got, lines = run_commands(body, tmp_path)
    check_answers(t, body, got, lines, chat=True)


def test_a_fork_planted_in_the_servers_verify_passes_is_reproduced_where_it_fell(tmp_path):
    """A server whose verify passes flip near-ties (a stand-in for batched kernels that round differently): the
    report's commands, run on that server, fork at the trace's token, and the zero-draft control does not."""
    pytest.importorskip("mlx_lm")
    import mlx_plants

    from specview.backends.mlx import write_random_model
    from specview.core.config import EngineSettings, RunConfig
    from specview.core.registry import get_backend

    target = write_random_model(tmp_path / "target", seed=1)
    draft = write_random_model(tmp_path / "draft", seed=2)
    launcher = mlx_plants.launcher(tmp_path, "near-tie")
    cfg = RunConfig(backend="mlx-server", target=str(target), draft=str(draft), spec_type="draft-simple", n_max=3,
                    max_tokens=20, prompt="the quick brown fox", chat=False, engine=EngineSettings(
                        server_bin=str(launcher)))
    with get_backend("mlx-server").runner() as runner:
        t = runner.run(cfg)
    assert t.comparison.first_mismatch is not None, "the planted verify passes flipped no near-tie"
    t, body, request = report(t, tmp_path / "issue")
    assert md_text(f"server_bin {launcher}") in body  # the program it ran is named, not dropped
    got, lines = run_commands(body, tmp_path, program=str(launcher))
    check_answers(t, body, got, lines, chat=False)
