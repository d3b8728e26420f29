"""``--ignore-eos`` on MLX and mlx_lm.server, as llama.cpp defines it: every end-of-generation token banned.

The target is a tiny random MLX llama whose output row of EOS is 1.5 times that of a word X its plain
greedy walk keeps coming to, so EOS comes top wherever the plain model would pick X; with EOS banned the
target decodes exactly the plain model's text (mlx-lm's own ``generate_step`` on the plain folder, an
independent reference).  The in-process MLX arms and mlx_lm.server's arms must both give it, token for
token, and never EOS.
"""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest
from require import require_module

mx = require_module("mlx.core")
require_module("mlx_lm")

from specview.backends.mlx import write_random_model  # noqa: E402
from specview.core.config import EngineSettings, RunConfig  # noqa: E402
from specview.core.registry import get_backend  # noqa: E402

PROMPT = "the quick brown fox"
N = 40
EOS = 1  # write_random_model's </s>
SCALE = 1.5


def plain_walk(folder, prompt_ids: list[int], n: int) -> tuple[list[int], list[int]]:
    """mlx-lm's greedy ``generate_step`` on ``folder``: the tokens, and the indices where EOS was the row's top-1."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, _ = load(str(folder))
    out, tops = [], []
    for j, (tok, lp) in zip(range(n), generate_step(mx.array(prompt_ids), model, max_tokens=n)):
        out.append(int(tok))
        if int(np.argmax(np.array(lp.astype(mx.float32)))) == EOS:
            tops.append(j)
    return out, tops


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("ignore-eos-mlx")
    plain = write_random_model(root / "plain", seed=1)
    draft = write_random_model(root / "draft", seed=2)
    ids = AutoTokenizer.from_pretrained(str(plain))(PROMPT)["input_ids"]
    ref, plain_tops = plain_walk(plain, ids, N)
    assert EOS not in ref and not plain_tops
    like = Counter(t for t in ref[2:] if t > 4).most_common(1)[0][0]  # not a special token
    target = root / "target"
    shutil.copytree(plain, target)
    w = dict(mx.load(str(target / "model.safetensors")))
    head = np.array(w["lm_head.weight"])
    head[EOS] = SCALE * head[like]
    w["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(target / "model.safetensors"), w)
    # EOS now comes top wherever the plain walk picks X: unbanned, the walk stops being the plain one there
    where = [j for j, t in enumerate(ref) if t == like]
    unbanned, tops = plain_walk(target, ids, N)
    assert len(where) >= 2 and tops and tops[0] == where[0] and unbanned[where[0]] == EOS
    assert unbanned[:where[0]] == ref[:where[0]]
    return {"target": str(target), "draft": str(draft), "ref": ref, "eos_top": where}


def cfg_for(models, backend: str, **kw) -> RunConfig:
    return RunConfig(backend=backend, target=models["target"], draft=models["draft"], spec_type="draft-simple",
                     n_max=3, max_tokens=N, prompt=PROMPT, chat=False, top_k=8, ignore_eos=True,
                     engine=EngineSettings(), **kw)


@pytest.fixture(scope="module")
def traces(models):
    with get_backend("mlx").runner() as runner:
        local = runner.run(cfg_for(models, "mlx"))
    with get_backend("mlx-server").runner() as runner:
        served = runner.run(cfg_for(models, "mlx-server"))
    return local, served


def test_in_process_mlx_arms_ban_eos(models, traces):
    local, _ = traces
    assert local.vanilla.tokens == models["ref"] and local.speculative.tokens == models["ref"]
    assert local.vanilla.stop_reason == local.speculative.stop_reason == "max_tokens"
    for st in local.vanilla.steps + local.speculative.steps:
        assert st.top_ids[0] == st.token and EOS not in st.top_ids


def test_mlx_lm_server_bans_eos_as_the_mlx_engine_does_token_for_token(models, traces):
    local, served = traces
    assert served.vanilla.tokens == local.vanilla.tokens == models["ref"]
    assert served.speculative.tokens == local.speculative.tokens == models["ref"]
    assert served.extra["server"]["vanilla"]["request"]["logit_bias"] == {str(EOS): float("-inf")}
    for st in served.vanilla.steps + served.speculative.steps:
        assert EOS not in st.top_ids


def test_the_outside_diagnosis_runs_mlx_lms_loops_with_the_servers_ban(models):
    """The diagnosis of an mlx_lm.server run replays mlx-lm's own loops in process: with ignore_eos they carry
    the same -inf logit bias as the server's requests, so they walk the text the server decoded."""
    from mlx_lm.utils import load
    from transformers import AutoTokenizer

    from specview.backends.mlx_server.diagnose import LoopSettings, speculative_rows, vanilla_rows

    model, _ = load(models["target"])
    draft, _ = load(models["draft"])
    ids = AutoTokenizer.from_pretrained(models["target"])(PROMPT)["input_ids"]

    def ls(ban):
        return LoopSettings(max_tokens=N, prefill_step_size=512, num_draft_tokens=3, kv_bits=None, kv_group_size=64,
                            ban=ban)

    never = lambda: False  # noqa: E731
    banned = [tok for tok, _row in vanilla_rows(model, ids, ls((EOS,)), N - 1, never)]
    assert banned == models["ref"]
    spec = [tok for tok, _row, _shape in speculative_rows(model, draft, ids, ls((EOS,)), N - 1, never)]
    assert spec == models["ref"]
    plain = [tok for tok, _row in vanilla_rows(model, ids, ls(()), N - 1, never)]
    first = models["eos_top"][0]
    assert plain[first] == EOS and plain[:first] == models["ref"][:first]
