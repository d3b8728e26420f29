"""The llama.cpp engine on tiny GGUF models written by the test suite."""

import door
import numpy as np
import pytest
from c_api_greedy import c_api_greedy

from specview.backends.llama_cpp import default_threads
from specview.core.arms.drafters import ModelDrafter
from specview.core.engine import IncompatibleVocab, ModelFileError, check_draft_compatible
from specview.core.arms.generate import GenOptions, run_to_end, speculative_greedy, vanilla_greedy
from specview.core.session import RunConfig, Session

S = door.settings(n_ctx=512, n_batch=64, n_ubatch=64)


@pytest.fixture(scope="module")
def store():
    s = door.store()
    yield s
    s.close()


def test_vanilla_arm_equals_an_independent_greedy_loop(store, tiny_target):
    m = store.get(tiny_target)
    prompt = m.tokenize("the cat and the dog")
    assert prompt[0] == 1  # BOS added as the vocabulary asks
    arm = run_to_end(vanilla_greedy(door.context(m, S), prompt, GenOptions(max_tokens=48, ignore_eos=True, n_batch=64)))
    # the reference shares no code with specview: greedy decoding written against the C API
    assert arm.tokens == c_api_greedy(tiny_target, prompt, 48, n_ctx=512, chunk=64, threads=default_threads(),
                                      ignore_eos=True)


def test_truncate_rolls_the_kv_cache_back_exactly(store, tiny_target):
    m = store.get(tiny_target)
    e = door.context(m, S)
    prompt = m.tokenize("the model and the draft")
    e.eval(prompt, rows=[-1])
    e.eval([40, 41, 42, 43], rows=[0])  # a rejected "draft"
    e.truncate(len(prompt))
    after = e.eval([50, 51], rows=[0, 1])
    fresh = door.context(m, S)
    fresh.eval(prompt, rows=[-1])
    ref = fresh.eval([50, 51], rows=[0, 1])
    np.testing.assert_array_equal(after, ref)
    assert e.n_past == fresh.n_past == len(prompt) + 2


def test_eval_returns_only_the_rows_asked_for(store, tiny_target):
    m = store.get(tiny_target)
    e = door.context(m, S)
    out = e.eval([1, 300, 301, 302, 303], rows=[1, -1])
    assert out.shape == (2, m.n_vocab) and out.dtype == np.float32
    e2 = door.context(m, S)
    all_rows = e2.eval([1, 300, 301, 302, 303], rows=range(5))
    np.testing.assert_allclose(out, all_rows[[1, 4]], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="n_batch"):
        e.eval([5] * 65, rows=[0])


def test_two_contexts_share_one_load(tiny_target):
    s = door.store()
    a = s.get(tiny_target)
    b = s.get(str(tiny_target))
    assert a is b and s.loads == 1
    e1, e2 = door.context(a, S), door.context(a, S)
    assert a.contexts == 2
    e1.close()
    e2.close()
    assert a.contexts == 0
    s.close()


def test_speculative_arm_is_lossless_on_a_tiny_f32_model(store, tiny_target, tiny_draft):
    m, d = store.get(tiny_target), store.get(tiny_draft)
    prompt = m.tokenize("the history of the bicycle")
    opts = GenOptions(max_tokens=60, ignore_eos=True, n_batch=64)
    van = run_to_end(vanilla_greedy(door.context(m, S), prompt, opts))
    spec = run_to_end(speculative_greedy(door.context(m, S), ModelDrafter(door.context(d, S), n_max=4), prompt, opts))
    assert spec.n_accepted > 0
    assert len(spec.tokens) == spec.n_accepted + len(spec.rounds)
    # F32 weights on a tiny model: batched and single-token passes agree to the last bit that matters
    assert spec.tokens == van.tokens


def test_vocabulary_facts_and_the_draft_check(store, tiny_dir):
    t = store.get(tiny_dir / "target.gguf")
    assert t.vocab.vocab_type == "spm" and t.vocab.bos == 1 and t.vocab.eos == 2 and 2 in t.vocab.eog
    check_draft_compatible(t.vocab, store.get(tiny_dir / "other.gguf").vocab)  # same tokenizer, other weights
    with pytest.raises(IncompatibleVocab, match=r"token 259 differs: target '▁the', draft '▁thex'"):
        check_draft_compatible(t.vocab, store.get(tiny_dir / "foreign.gguf").vocab)


def test_model_facts_come_from_the_gguf(store, tiny_target):
    f = store.get(tiny_target).facts()
    assert f["architecture"] == "llama" and f["quantization"] == "F32"
    assert f["n_vocab"] == store.get(tiny_target).n_vocab and f["file_size"] == tiny_target.stat().st_size
    assert f["path"] == str(tiny_target.resolve())


def test_missing_corrupt_and_truncated_files_give_clear_errors(tmp_path, tiny_target):
    with pytest.raises(ModelFileError, match="no such file"):
        door.model(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="is a folder"):
        door.model(tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFileError, match="not a GGUF model file"):
        door.model(junk)
    stub = tmp_path / "stub.gguf"
    stub.write_bytes(tiny_target.read_bytes()[:15])
    with pytest.raises(ModelFileError, match=r"cut short \(15 bytes") as ei:
        door.model(stub)
    assert "not a GGUF" not in str(ei.value)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="could not load this model") as ei:
        door.model(cut)
    assert str(cut) in str(ei.value)


def test_session_refuses_an_incompatible_draft_with_what_differs(tiny_dir):
    s = Session()
    cfg = RunConfig(target=str(tiny_dir / "target.gguf"), draft=str(tiny_dir / "foreign.gguf"),
                    prompt="the cat", chat=False, max_tokens=8)
    with pytest.raises(IncompatibleVocab, match="token 259 differs"):
        s.run(cfg)
    s.close()


def test_chat_template_is_applied(store, tiny_target):
    m = store.get(tiny_target)
    plain = m.tokenize("hi")
    chat = m.tokenize("hi", chat=True)
    assert len(chat) > len(plain)
    assert "<|im_start|>user\nhi<|im_end|>" in m.detokenize(chat)


def test_environment_names_versions_and_ggml_devices():
    from specview.backends.llama_cpp import llama_environment

    env = llama_environment()
    import llama_cpp

    assert env["llama_cpp_python"] == llama_cpp.__version__
    assert any(d["name"] == "CPU" for d in env["ggml_devices"])  # every build has the CPU device
    assert "CPU" in env["llama_cpp_system_info"]


def test_trace_records_the_threads_really_used(tiny_target, monkeypatch):
    monkeypatch.setenv("SPECVIEW_THREADS", "1")
    s = Session()
    t = s.run(RunConfig(target=str(tiny_target), spec_type="none", draft=None, prompt="the cat", chat=False,
                        max_tokens=4))
    assert t.config["engine"]["threads"] == 0 and t.config["threads_used"] == 1
    s.close()
