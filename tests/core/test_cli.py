"""`specview run` end to end on tiny models: summary, exit status, JSON, clear errors."""

import json
import subprocess
import sys

import pytest

from specview.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_identical_run_exits_0_and_writes_the_trace(capsys, tiny_dir, tmp_path):
    out_json = tmp_path / "t.json"
    code, out, err = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"),
                         "--draft", str(tiny_dir / "draft.gguf"), "--prompt", "the cat", "--no-chat",
                         "--max-tokens", "40", "--ignore-eos", "--n-max", "4", "--json", str(out_json), "-q")
    assert code == 0, err
    assert "IDENTICAL: both arms produced the same 40 tokens." in out
    d = json.loads(out_json.read_text())
    assert d["comparison"]["identical"] is True
    assert d["config"]["n_max"] == 4 and d["config"]["chat"] is False
    assert len(d["vanilla"]["tokens"]) == 40
    assert sum(r["accepted"] for r in d["speculative"]["rounds"]) + len(d["speculative"]["rounds"]) == 40


def test_raw_tokens_bypass_the_tokenizer(capsys, tiny_dir, tmp_path):
    out_json = tmp_path / "t.json"
    code, out, err = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"), "--spec-type", "ngram-simple",
                         "--tokens", "1, 300 301 302", "--max-tokens", "12", "--ignore-eos", "--json", str(out_json),
                         "-q")
    assert code in (0, 1), err
    d = json.loads(out_json.read_text())
    assert d["prompt"]["tokens"] == [1, 300, 301, 302]
    assert d["prompt"]["raw_tokens"] is True and d["models"]["draft"] is None


def test_divergence_exits_1_with_the_fork_in_context(capsys, tiny_dir, tmp_path, monkeypatch):
    # tiny F32 models never fork, so plant one in the speculative arm the command receives
    from specview.core.session import Session

    real = Session.run

    def forked(self, cfg, **kw):
        t = real(self, cfg, **kw)
        from specview.core.arms.compare import compare_arms

        s = t.speculative
        s.tokens[5] = (s.tokens[5] + 1) % 300
        s.steps[5].token = s.tokens[5]
        s.steps[5].piece = "<FORK>"
        t.comparison = compare_arms(t.vanilla, s)
        return t

    monkeypatch.setattr(Session, "run", forked)
    monkeypatch.setenv("SPECVIEW_WORKER", "0")  # the planted Session.run is this process's
    code, out, _ = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"), "--draft", str(tiny_dir / "draft.gguf"),
                       "--prompt", "the cat", "--no-chat", "--max-tokens", "20", "--ignore-eos", "-q", "--no-diagnose")
    assert code == 1
    assert "DIVERGED at token 5" in out
    assert "[[<FORK>]]" in out


@pytest.mark.parametrize("flags, said", [
    (["--n-max", "0"], "IDENTICAL: both arms produced the same 30 tokens, but nothing was drafted (n_max 0 allows no "
                       "draft token): inconclusive for speculative decoding; raise n_max to 3."),
    (["--spec-type", "none"], "IDENTICAL: both arms produced the same 30 tokens, but nothing was drafted (the spec "
                              "type is none, so no drafter ran): inconclusive for speculative decoding; use a draft "
                              "model (spec type draft-simple)."),
    (["--serial-verify"], "IDENTICAL: both arms produced the same 30 tokens, with serial verify: the loop was tested, "
                          "batched verification was not."),
    ([], "IDENTICAL: both arms produced the same 30 tokens."),
])
def test_an_identical_headline_says_what_the_run_did_not_test(capsys, tiny_dir, flags, said):
    code, out, err = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"), "--draft",
                         str(tiny_dir / "draft.gguf"), "--prompt", "the cat", "--no-chat", "--max-tokens", "30",
                         "--ignore-eos", "-q", "--no-diagnose", *flags)
    assert code == 0, err  # the tokens are identical: the exit status says so, the headline says what it means
    assert said in out.splitlines(), out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--target", "/nonexistent/model.gguf", "--spec-type", "none"], "no such file"),
        (["run", "--target", "demo:Q9_9"], "unknown demo quantization"),
        (["run", "--target", "x.gguf"], "needs --draft"),
        (["run", "--tokens", "1,a,3"], "--tokens takes integer"),
        (["run", "--p-min", "2"], "--p-min must be between 0 and 1"),
        (["run", "--prompt-file", "/nonexistent/prompt.txt"], "no such file"),
    ],
)
def test_bad_input_exits_2_with_a_specific_message(capsys, argv, message):
    code, out, err = run(capsys, *argv, "-q")
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["run", "--n_max", "3"], ["specview run: error: unrecognized arguments: --n_max 3",
                                   "--n_max: did you mean --n-max?", "`specview run --help`"]),
        (["run", "--draft-max", "2"], ["specview run: error: unrecognized arguments: --draft-max 2",
                                       "--draft-max is llama.cpp's removed name for --spec-draft-n-max"]),
        (["matrix", "spec.toml"], ["specview matrix: error: unrecognized arguments: spec.toml"]),
        (["--bogus"], ["specview: error: unrecognized arguments: --bogus", "`specview --help`"]),
    ],
)
def test_an_unknown_argument_is_named_by_the_command_that_refuses_it(capsys, argv, said):
    with pytest.raises(SystemExit) as ex:
        main(argv)
    err = capsys.readouterr().err
    assert ex.value.code == 2
    assert all(s in err for s in said), err
    assert err.splitlines()[-1].startswith(said[0])
    assert err.splitlines()[0].startswith("usage: " + said[0].split(":")[0])  # the usage shown is that command's


def test_llama_cpp_s_draft_p_min_is_read_as_p_min():
    from specview.cli import build_parser

    args = build_parser(only="run").parse_args(["run", "--draft-p-min", "0.5"])
    assert args.p_min == 0.5


def test_a_prompt_longer_than_the_context_is_refused(capsys, tiny_dir):
    code, _, err = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"), "--spec-type", "none",
                       "--prompt", "the cat " * 200, "--no-chat", "--n-ctx", "256", "-q")
    assert code == 2
    assert "Raise --n-ctx to at least" in err


def test_corrupt_draft_file_names_the_file(capsys, tiny_dir, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 200)
    code, _, err = run(capsys, "run", "--target", str(tiny_dir / "target.gguf"), "--draft", str(bad),
                       "--prompt", "x", "--no-chat", "-q")
    assert code == 2 and str(bad) in err and "could not load" in err


def test_help_is_instant_and_imports_no_heavy_library():
    code = ("import sys, specview.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('llama_cpp', 'PySide6', 'pyqtgraph', 'mlx') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "HEAVY []" in out
    assert "run" in out and "models" in out


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "specview", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("specview ")
