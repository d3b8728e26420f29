"""What a new user's first tries did to the llama.cpp engine, each pinned down.

* ``-c 16``: llama.cpp clamps n_batch to n_ctx (and pads n_ctx), so every size
  specview uses must be read back from the context, the prefill must chunk at
  the real n_batch, and a context too small for the run is a clear error.
* a GGUF without a chat template, with chat on (the default): the prompt is fed
  as plain text, as llama.cpp's llama-completion does, and the trace says so.
* ``$SPECVIEW_THREADS`` and ``-t``: how the thread count is resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import door
import pytest

from specview.backends.llama_cpp import default_threads, resolve_threads
from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import ConfigError, ContextOverflow, SpecviewError
from specview.core.arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy
from specview.core.arms.drafters import ModelDrafter
from specview.core.session import Session
from c_api_greedy import c_api_greedy
from tinymodel import write_tiny_llama

LONG = ("the history of the bicycle is the history of a model and a draft and a target that fork "
        "on a token in the essay of the students and the cat and the dog")


@pytest.fixture(scope="module")
def model(tiny_target):
    m = door.model(tiny_target)
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A tiny GGUF with no tokenizer.chat_template."""
    return write_tiny_llama(tmp_path_factory.mktemp("plain") / "plain.gguf", seed=0, chat_template=False)


def raw_sizes(path: Path, n_ctx: int, n_batch: int, n_ubatch: int) -> tuple[int, int, int]:
    """n_ctx, n_batch, n_ubatch of a context made directly through llama-cpp-python, sharing no code with specview
    but this machine's repack decision (``door.c_load``)."""
    import llama_cpp as ll

    model = door.c_load(ll, path)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_ubatch
    cp.n_threads = cp.n_threads_batch = 1
    ctx = door.c_context(ll, model, cp)
    try:
        return ll.llama_n_ctx(ctx), ll.llama_n_batch(ctx), ll.llama_n_ubatch(ctx)
    finally:
        ll.llama_free(ctx)
        ll.llama_model_free(model)


# -- sizes come from the context llama.cpp made -----------------------------------------------------
@pytest.mark.parametrize("n_ctx, n_batch, n_ubatch", [(16, 512, 512), (300, 64, 8), (512, 32, 64)])
def test_engine_sizes_are_the_ones_llama_cpp_made(model, tiny_target, n_ctx, n_batch, n_ubatch):
    e = door.context(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, threads=1)
    try:
        assert (e.n_ctx, e.n_batch, e.n_ubatch) == raw_sizes(tiny_target, n_ctx, n_batch, min(n_ubatch, n_batch))
        assert e.n_batch <= n_batch and e.n_ubatch <= e.n_batch and e.n_ctx >= n_ctx
        assert e.sizes() == {"n_ctx": e.n_ctx, "n_batch": e.n_batch, "n_ubatch": e.n_ubatch, "threads": 1}
        sib = e.sibling()  # a second context asks for what the first asked for, so it gets the same sizes
        assert (sib.n_ctx, sib.n_batch, sib.n_ubatch) == (e.n_ctx, e.n_batch, e.n_ubatch)
        sib.close()
    finally:
        e.close()


def test_a_small_context_clamps_n_batch_and_the_prefill_chunks_at_it(model, tiny_target):
    prompt = model.tokenize(LONG)
    e = door.context(model, n_ctx=16, n_batch=512, n_ubatch=512, threads=1)
    assert e.n_batch < len(prompt) < e.n_ctx  # the case that aborted: a prompt longer than the clamped n_batch
    arm = run_to_end(vanilla_greedy(e, prompt, GenOptions(max_tokens=12, ignore_eos=True, n_batch=512)))
    last = len(prompt) % e.n_batch or e.n_batch
    assert (arm.steps[0].batch_size, arm.steps[0].batch_index) == (last, last - 1)
    assert arm.tokens == c_api_greedy(tiny_target, prompt, 12, n_ctx=16, chunk=e.n_batch, threads=1,
                                      ignore_eos=True)
    e.close()


def test_the_draft_context_chunks_at_its_real_n_batch_too(model, tiny_target, tiny_draft):
    d = door.model(tiny_draft)
    prompt = model.tokenize(LONG)
    s = door.settings(n_batch=512, n_ubatch=512, threads=1)
    opts = GenOptions(max_tokens=24, ignore_eos=True, n_batch=512)
    van = run_to_end(vanilla_greedy(door.context(model, s, n_ctx=16), prompt, opts))
    drafter = ModelDrafter(door.context(d, s, n_ctx=16), n_max=3, n_batch=512)
    assert drafter.n_batch == 16
    spec = run_to_end(speculative_greedy(door.context(model, s, n_ctx=16), drafter, prompt, opts, n_max_hint=3,
                                         serial_verify=True))
    assert spec.n_drafted > 0 and len(spec.tokens) == spec.n_accepted + len(spec.rounds)
    assert spec.tokens == van.tokens  # verify rows as single-token passes: exactly vanilla, on any CPU
    d.close()


def test_a_verify_pass_wider_than_n_batch_is_refused_up_front(model):
    e = door.context(model, n_ctx=256, n_batch=4, n_ubatch=4, threads=1)
    d = door.context(model, n_ctx=256, n_batch=4, n_ubatch=4, threads=1)
    prompt = model.tokenize("the cat")
    gen = speculative_greedy(e, ModelDrafter(d, n_max=8), prompt, GenOptions(max_tokens=20, n_batch=4), n_max_hint=8)
    with pytest.raises(ContextOverflow, match=r"up to 9 tokens.*n_batch = 4"):
        next(gen)
    assert e.n_past == 0  # refused before anything was evaluated
    e.close()
    d.close()


def test_eval_refuses_more_tokens_than_the_context_takes_instead_of_aborting(model):
    e = door.context(model, n_ctx=16, n_batch=512, threads=1)
    with pytest.raises(ValueError, match=f"exceed n_batch={e.n_batch}"):
        e.eval(list(range(300, 300 + e.n_batch + 1)), rows=[-1])
    with pytest.raises(ValueError, match="outside"):
        e.eval([300, 301], rows=[2])
    e.close()


def run_cli(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    """`specview run` in a child process: a llama.cpp abort there fails this test instead of killing pytest."""
    env = {**os.environ, "SPECVIEW_THREADS": "1", "SPECVIEW_CACHE": str(tmp / "cache"), "GGML_NO_BACKTRACE": "1"}
    return subprocess.run([sys.executable, "-m", "specview.cli", "run", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_cli_with_a_16_token_context_runs_or_says_why_it_cannot(tiny_target, tiny_draft, tmp_path):
    out = tmp_path / "c16.json"
    ok = run_cli("-m", str(tiny_target), "-md", str(tiny_draft), "-c", "16", "-n", "8", "--ignore-eos", "-q",
                 "--no-diagnose", "-p", LONG, "--json", str(out), tmp=tmp_path)
    assert ok.returncode in (0, 1), ok.stderr  # identical or diverged; never -6 (SIGABRT) from GGML_ASSERT
    t = json.loads(out.read_text())
    used = t["config"]["context_used"]
    assert used["n_batch"] < len(t["prompt"]["tokens"]) and used["n_ubatch"] <= used["n_batch"]
    assert t["config"]["n_ctx_used"] == 16 and used["n_ctx"] >= 16
    assert t["vanilla"]["steps"][0]["batch_size"] <= used["n_batch"]
    assert t["speculative"]["rounds"][0]["batch_size"] <= used["n_batch"]

    full = run_cli("-m", str(tiny_target), "-md", str(tiny_draft), "-c", "16", "-q", "--no-diagnose",
                   "-p", "Hello there, how are you?", tmp=tmp_path)
    assert full.returncode == 2, full.stderr
    assert "specview: error:" in full.stderr and "Traceback" not in full.stderr
    assert "needs a context of" in full.stderr and "--n-ctx" in full.stderr


# -- a model without a chat template --------------------------------------------------------------
def test_a_model_without_a_chat_template_gets_the_plain_text_and_a_note(plain_model, tiny_target):
    m = door.model(plain_model)
    try:
        assert m.chat_template is None
        assert m.tokenize(LONG, chat=True) == m.tokenize(LONG, chat=False)
        assert plain_model.name in m.chat_note and "plain text" in m.chat_note and "\n" not in m.chat_note
    finally:
        m.close()
    t = door.model(tiny_target)
    try:
        assert t.chat_template and t.chat_note is None
        assert t.tokenize("hi", chat=True) != t.tokenize("hi", chat=False)
    finally:
        t.close()


def test_the_trace_of_a_chat_run_on_such_a_model_records_the_note(plain_model, tiny_target, tmp_path):
    base = dict(spec_type="none", draft=None, prompt="the cat", max_tokens=4, ignore_eos=True,
                engine=EngineSettings(threads=1))
    with Session() as s:
        t = s.run(RunConfig(target=str(plain_model), chat=True, **base))
        assert t.prompt["chat"] is True and "no chat template" in t.prompt["chat_note"]
        assert t.prompt["tokens"] == door.model(plain_model).tokenize("the cat")
        assert "chat_note" not in s.run(RunConfig(target=str(plain_model), chat=False, **base)).prompt
        assert "chat_note" not in s.run(RunConfig(target=str(tiny_target), chat=True, **base)).prompt
        from specview.core.trace import Trace

        back = Trace.load(t.save(tmp_path / "plain.json"))
        assert back.prompt["chat_note"] == t.prompt["chat_note"]


def test_the_vocabulary_only_model_tokenizes_like_the_full_one_and_cannot_evaluate(tiny_target):
    full, voc = door.model(tiny_target), door.model(tiny_target, vocab_only=True)
    try:
        assert voc.vocab_only and voc.tokenize(LONG, chat=True) == full.tokenize(LONG, chat=True)
        assert voc.vocab.texts == full.vocab.texts and voc.facts()["quantization"] == "F32"
        with pytest.raises(SpecviewError, match="vocabulary only"):
            door.context(voc)
    finally:
        voc.close()
        full.close()


def test_a_prompt_that_is_not_unicode_text_is_a_clear_error(model):
    with pytest.raises(SpecviewError, match="lone surrogate"):
        model.tokenize("the cat \udcff")


# -- threads -----------------------------------------------------------------------------------------
def test_threads_resolve_from_the_setting_then_the_variable_then_the_cores(monkeypatch):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv("SPECVIEW_THREADS", raising=False)
    assert default_threads() == cores  # every core this process may run on
    monkeypatch.setenv("SPECVIEW_THREADS", "0")
    assert default_threads() == cores  # 0 means every core, like -t 0
    monkeypatch.setenv("SPECVIEW_THREADS", " 3 ")
    assert default_threads() == 3 and resolve_threads(0) == 3
    assert resolve_threads(5) == 5  # an explicit -t wins over the variable
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv("SPECVIEW_THREADS", bad)
        with pytest.raises(ConfigError, match="SPECVIEW_THREADS"):
            default_threads()


def test_the_context_uses_the_resolved_thread_count(model, monkeypatch):
    monkeypatch.setenv("SPECVIEW_THREADS", "1")
    e = door.context(model, n_ctx=64, threads=0)
    assert e.threads == 1 and model._ll.llama_n_threads(e.ctx) == 1
    e.close()
    e = door.context(model, n_ctx=64, threads=2)
    assert e.threads == 2 and model._ll.llama_n_threads(e.ctx) == 2
    e.close()


# -- imports -------------------------------------------------------------------------------------------
def test_core_and_this_backend_import_with_qt_and_llama_cpp_hidden(tmp_path):
    """The core, the demo's names and this package import without PySide6, pyqtgraph or llama-cpp-python;
    the engine then says plainly that llama-cpp-python is missing, and the demo list still works."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6', 'llama_cpp'):\n"
        "            raise ImportError(f'{name} is hidden for this check')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Block())\n"
        "import specview.core.session, specview.core.diagnose, specview.core.matrix, specview.core.demo\n"
        "import specview.backends.llama_cpp as lc\n"
        "from specview.backends.llama_cpp import demo\n"
        "from specview.core.registry import get_backend\n"
        "from specview.core.errors import BackendUnavailable\n"
        "assert [r['name'] for r in demo.available()][0] == 'demo:F32'\n"
        "try:\n"
        "    get_backend('llama.cpp')\n"
        "except BackendUnavailable as exc:\n"
        "    assert 'pip install llama-cpp-python' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('the llama.cpp engine loaded without llama-cpp-python')\n"
        "assert not any(m.split('.')[0] in ('PySide6', 'pyqtgraph', 'llama_cpp') for m in sys.modules)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "SPECVIEW_CACHE": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
