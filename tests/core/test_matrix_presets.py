"""Preset matrices and the drafters axis's spec types, on a fake engine whose faults are planted.

The fake engine follows a stated rule (a quantized target forks where a model
drafter's tokens are verified in batches; full-precision targets, n-gram
drafters and zero drafts never fork), and a test can plant a fault against it:
plain decoding that differs from itself, a p_min 1 that still drafts.  Each
preset finding must then say what the planted cells say, and nothing the cells
contradict.
"""

from __future__ import annotations

import pytest

from specview.commands.matrix import every_drafter
from specview.core.arms.compare import compare_arms
from specview.core.config import LLAMA_SPEC_TYPES, RunConfig
from specview.core.matrix import describe, expand, load_matrix, run_matrix
from specview.core.matrix.cells import cell_config, model_label
from specview.core.matrix.preset import findings, load_preset, preset_names
from specview.core.matrix.spec import MatrixError, MatrixSpec, drafter_parts
from specview.core.prompts import PromptSpec
from specview.core.registry import Backend, Runner, register_backend, unregister_backend
from specview.core.trace import ArmResult, Round, Step, Trace


def _arm(name: str, tokens: list[int], rounds: list[Round]) -> ArmResult:
    steps = [Step(index=i, token=t, piece=f" w{t}", pos=5 + i, top_ids=[t, t + 1], top_logits=[1.0, 0.9],
                  margin=0.1) for i, t in enumerate(tokens)]
    return ArmResult(name=name, tokens=tokens, steps=steps, rounds=rounds, text="".join(s.piece for s in steps),
                     gen_ms=100.0, stop_reason="max_tokens", drafter=None if name == "vanilla" else "x")


class Planted(Runner):
    """Forks at token 5 where a model drafter drafts on a quantized target; ``plant`` breaks one rule."""

    def __init__(self, plant: str = ""):
        self.plant = plant
        self.loads = self.vanilla_runs = self.speculative_runs = 0

    def close(self):
        pass

    def diagnose(self, trace, cfg, *, controls=False, progress=None, cancel=None):
        raise AssertionError("the preset tests run with diagnose off")

    def run(self, cfg: RunConfig, *, cancel=None, on_event=None) -> Trace:
        self.speculative_runs += 1
        n = cfg.max_tokens
        model = cfg.spec_type.startswith("draft-")
        drafted = 0 if (not model and cfg.spec_type != "ngram-simple") or cfg.p_min >= 1.0 else 4
        if self.plant == "p-min-1-drafts" and cfg.p_min >= 1.0:
            drafted = 2
        full = any(q in cfg.target for q in ("F16", "BF16", "F32"))
        fork = 5 if model and drafted and not full else None
        if self.plant == "nondeterministic" and cfg.spec_type == "none":
            fork = 9
        if self.plant == "n-max-1-clean" and cfg.n_max == 1:
            fork = None
        if self.plant == "full-precision-forks" and full and model and drafted:
            fork = 8
        if self.plant == "ngram-accepts-nothing" and cfg.spec_type == "ngram-simple":
            drafted = 0
        v = list(range(100, 100 + n))
        s = v if fork is None else v[:fork] + [7] + v[fork + 1:]
        rounds = [Round(index=0, drafted=0, accepted=0, draft_ms=0, verify_ms=1, batch_size=4, first_step=0),
                  Round(index=1, drafted=drafted, accepted=drafted // 2, draft_ms=1, verify_ms=1,
                        batch_size=drafted + 1, first_step=1)]
        va, sa = _arm("vanilla", v, []), _arm("speculative", s, rounds)
        return Trace(config=cfg.to_dict(), environment={"specview": "test"},
                     models={"target": {"file": cfg.target, "quantization": cfg.target.split(":")[-1]}, "draft": None},
                     prompt={"text": cfg.prompt, "chat": cfg.chat, "tokens": [1, 2, 3]},
                     vanilla=va, speculative=sa, comparison=compare_arms(va, sa))


@pytest.fixture
def engine():
    """A registered engine that offers every llama.cpp spec type (as a llama-server binary would)."""
    box = {"runner": Planted()}

    class AllTypes(Backend):
        name = "planted-server"
        label = "planted"
        model_kind = "gguf"
        in_process = False

        def spec_types(self, settings=None):
            return list(LLAMA_SPEC_TYPES)

        def check(self, cfg):
            pass

        def runner(self, *, progress=None):
            return box["runner"]

    register_backend("planted-server", AllTypes)  # a callable: the engine stays in this process
    yield box
    unregister_backend("planted-server")


def run_preset(name: str, tmp_path, engine, plant: str = "", **models) -> dict:
    spec = load_preset(name, models)
    spec.backend = "planted-server"
    spec.max_tokens = 16
    spec.diagnose = False
    engine["runner"] = Planted(plant)
    run_matrix(spec, engine["runner"], out=tmp_path / f"{name}.json")
    return load_matrix(tmp_path / f"{name}.json")


def found(doc: dict) -> dict[str, dict]:
    return {f["part"]: f for f in findings(doc)}


def test_the_shipped_presets_load_and_name_their_parts():
    assert preset_names() == ["lfm2-draft", "llama-cpp-dspark"]
    s = load_preset("llama-cpp-dspark")
    assert [p["name"] for p in s.parts] == ["vanilla-twice", "ngram", "dspark", "dspark-fa-off", "bf16"]
    cells = expand(s)
    assert [c.part for c in cells] == ["vanilla-twice", "ngram", "dspark", "dspark-fa-off"] + ["bf16"] * 3
    dspark = cells[2]
    assert (dspark.spec_type, dspark.draft, dspark.n_max, dspark.p_min) == ("draft-dspark", "demo:dspark", 7, 0.0)
    assert cells[3].flash_attn == "off" and {c.target for c in cells[4:]} == {"demo:BF16"}
    assert [c.prompt for c in cells[4:]] == ["repeat", "essay", "code"] and cells[0].prompt == "repeat"
    assert cells[1].n_max is None and cells[0].n_max is None  # n-gram and none read no n_max
    assert describe(dspark) == "dspark: Q4_K_M · draft-dspark n_max=7 p_min=0 · fa=auto · repeat"
    cfg = cell_config(s, dspark)
    assert (cfg.spec_type, cfg.draft, cfg.n_max, cfg.target) == ("draft-dspark", "demo:dspark", 7, "demo:Q4_K_M")


def test_a_role_takes_the_users_model_and_the_spec_round_trips(tmp_path):
    target = tmp_path / "mine-Q8_0.gguf"
    target.write_bytes(b"GGUF" + bytes(60))
    s = load_preset("lfm2-draft", {"quantized": str(target), "draft": "draft-dspark:demo:dspark"})
    cells = expand(s)
    assert {c.target for c in cells if c.part != "f16"} == {str(target)}
    assert {c.spec_type for c in cells} == {"draft-dspark"} and {c.draft for c in cells} == {"demo:dspark"}
    back = MatrixSpec.from_json(s.to_json())
    assert expand(back) == cells and back.preset["models"]["quantized"]["model"] == str(target)


def test_a_relative_model_on_the_command_line_is_taken_from_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "mine.gguf").write_bytes(b"GGUF" + bytes(60))
    (tmp_path / "my-dspark.gguf").write_bytes(b"GGUF" + bytes(60))
    monkeypatch.chdir(tmp_path)
    s = load_preset("lfm2-draft", {"quantized": "mine.gguf", "draft": "draft-dspark:my-dspark.gguf"})
    cells = expand(s)
    assert cells[0].target == str(tmp_path / "mine.gguf")
    assert cells[0].drafter == f"draft-dspark:{tmp_path / 'my-dspark.gguf'}"
    assert {c.target for c in cells if c.part == "f16"} == {"demo:F16"}


@pytest.mark.parametrize("models, words", [
    ({"nosuch": "x.gguf"}, "has no model role 'nosuch'; its roles: quantized"),
    ({"quantized": "demo:Q9_9"}, "unknown demo quantization"),
    ({"draft": "demo:eagle3"}, None),  # a demo drafter names its own type: allowed
])
def test_role_models_are_checked(models, words, engine):
    if words is None:
        s = load_preset("lfm2-draft", models)
        assert {c.spec_type for c in expand(s)} == {"draft-eagle3"}
        return
    with pytest.raises(MatrixError, match=words):
        s = load_preset("lfm2-draft", models)
        s.backend = "planted-server"
        s.validate()


@pytest.mark.parametrize("edit, words", [
    (("role = \"subject\"", "role = \"hero\""), "role 'hero' is not one of determinism"),
    (("n_max = [7]\np_min = [0.0]\n\n[[part]]\nname = \"dspark-fa-off\"", "n_max = [7]\ncolour = 1\np_min = [0.0]\n\n[[part]]\nname = \"dspark-fa-off\""), "unknown key\\(s\\) colour"),
    (("prompts = \"all\"", "prompts = \"some\""), "prompts must be \"first\" or \"all\""),
    (("{dspark}", "{drafty}"), "names the model role \\{drafty\\}"),
    (("n_max = [7]", "n_max = [-1]"), "n_max"),
])
def test_a_broken_preset_file_is_refused_with_its_place(tmp_path, edit, words):
    from specview.core.matrix.preset import PRESETS_DIR

    text = (PRESETS_DIR / "llama-cpp-dspark.toml").read_text()
    assert edit[0] in text
    p = tmp_path / "mine.toml"
    p.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(MatrixError, match=words) as ei:
        load_preset(str(p))
    assert str(p) in str(ei.value)


def test_the_dspark_preset_on_a_sound_engine_says_what_localises_the_fork(tmp_path, engine):
    doc = run_preset("llama-cpp-dspark", tmp_path, engine)
    f = found(doc)
    assert {k: v["outcome"] for k, v in f.items()} == {
        "vanilla-twice": "identical", "ngram": "identical", "dspark": "forks", "dspark-fa-off": "forks",
        "bf16": "identical"}
    assert "deterministic here" in f["vanilla-twice"]["text"]
    assert "with 2 of 4 drafted tokens accepted" in f["ngram"]["text"] and "is sound" in f["ngram"]["text"]
    assert f["dspark"]["text"].startswith("draft-dspark at n_max 7 on the quantized target: forks at token 5 "
                                          "(diverged (not diagnosed)): vanilla ' w105', speculative ' w7'")
    assert "still forks at token 5" in f["dspark-fa-off"]["text"]
    assert "; -fa off does not remove the fork" in f["dspark-fa-off"]["text"]
    assert "identical on all 3 prompts" in f["bf16"]["text"] and "needs the quantized weights" in f["bf16"]["text"]
    together = [line for line in doc["summary"] if line.startswith("Together:")]
    assert together == [
        "Together: plain decoding is deterministic, speculation that drafts from the text stays lossless and "
        "full-precision weights stay identical, so the fork comes from the quantized target's batched verify "
        "passes: the signature of batched against single-token numerics. Whether each fork is a harmless "
        "near-tie or a bug is its verdict."]
    assert doc["summary"][0].startswith("Preset llama-cpp-dspark: llama.cpp's draft-dspark report")


def test_plain_decoding_that_differs_from_itself_voids_the_rest(tmp_path, engine):
    doc = run_preset("llama-cpp-dspark", tmp_path, engine, plant="nondeterministic")
    f = found(doc)
    assert f["vanilla-twice"]["outcome"] == "forks"
    assert "forks at token 9" in f["vanilla-twice"]["text"] and "not deterministic" in f["vanilla-twice"]["text"]
    assert [x for x in doc["summary"] if x.startswith("Together:")] == [
        "Together: plain decoding is not deterministic here, which must be fixed before anything else."]


def test_the_lfm2_preset_names_the_zero_draft_control_and_what_n_max_1_changes(tmp_path, engine):
    doc = run_preset("lfm2-draft", tmp_path, engine, plant="n-max-1-clean")
    f = found(doc)
    assert f["draft"]["outcome"] == "forks" and f["p-min-1"]["outcome"] == "identical"
    assert f["p-min-1"]["text"] == ("The same with --spec-draft-p-min 1: nothing drafted and identical over 16 "
                                    "tokens. With a draft the subject forks, so the fork needs drafted tokens in "
                                    "the verify pass.")
    assert f["n-max-1"]["text"].endswith("; --spec-draft-n-max 1 removes the subject's fork.")
    assert "identical on both prompts" in f["f16"]["text"]
    assert any("drafting nothing restores the output" in x for x in doc["summary"])


def test_a_zero_draft_cell_that_drafts_proves_nothing(tmp_path, engine):
    doc = run_preset("lfm2-draft", tmp_path, engine, plant="p-min-1-drafts")
    f = found(doc)["p-min-1"]
    assert f["text"] == ("The same with --spec-draft-p-min 1: 2 tokens were still drafted, so this is not a "
                         "zero-draft control and proves nothing.")
    assert not any("drafting nothing restores" in x for x in doc["summary"])


# -- the drafters axis: every llama.cpp spec type ------------------------------------------
@pytest.mark.parametrize("name, parts", [
    ("demo:Q4_0", ("draft-simple", "demo:Q4_0")),
    ("small.gguf", ("draft-simple", "small.gguf")),
    ("draft-eagle3:eagle.gguf", ("draft-eagle3", "eagle.gguf")),
    ("draft-dspark:demo:dspark", ("draft-dspark", "demo:dspark")),
    ("demo:dflash", ("draft-dflash", "demo:dflash")),
    ("draft-mtp", ("draft-mtp", None)),
    ("ngram-mod", ("ngram-mod", None)),
    ("none", ("none", None)),
    ("draft-eagle3:", ("draft-simple", "draft-eagle3:")),  # no file after the colon: a path, refused as missing
])
def test_a_drafter_names_its_spec_type_and_its_file(name, parts):
    assert drafter_parts(name) == parts


def test_typed_drafters_expand_with_the_axes_their_type_reads(engine):
    s = MatrixSpec(targets=["demo:Q4_K_M"], drafters=["draft-mtp", "ngram-mod", "draft-eagle3:demo:eagle3",
                                                      "draft-dflash:e.gguf"],
                   n_max=[1, 4], p_min=[0.0], prompts=[PromptSpec("p", "hi")], backend="planted-server")
    cells = expand(s)
    by = {}
    for c in cells:
        by.setdefault(c.drafter, []).append(c.n_max)
    assert by == {"draft-mtp": [1, 4], "ngram-mod": [None], "draft-eagle3:demo:eagle3": [1, 4],
                  "draft-dflash:e.gguf": [1, 4]}
    assert [model_label(d) for d in s.drafters] == ["draft-mtp", "ngram-mod", "draft-eagle3", "draft-dflash:e.gguf"]
    assert cell_config(s, cells[-1]).draft == "e.gguf"


def test_an_in_process_engine_refuses_a_server_only_type_up_front():
    s = MatrixSpec(targets=["demo:Q4_K_M"], drafters=["ngram-mod"], prompts=[PromptSpec("p", "hi")])
    with pytest.raises(MatrixError, match="drafter ngram-mod: the llama.cpp engine runs draft-simple, ngram-simple, "
                                          "none; the llama-server engine runs every type its binary lists"):
        s.validate()


def test_all_spells_out_every_type_with_a_drafter(engine, tmp_path):
    s = MatrixSpec(targets=["demo:Q4_K_M"], drafters=["all"], prompts=[PromptSpec("p", "hi")],
                   backend="planted-server")
    drafters, left = every_drafter(s)
    assert drafters == ["demo:Q4_0", "demo:eagle3", "demo:dflash", "demo:dspark", "ngram-simple", "ngram-map-k",
                        "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    assert left == ["draft-mtp (demo:Q4_K_M has no MTP head)"]
    # a user's target: its drafters are the ones given; the others are named with what to give
    mine = tmp_path / "t.gguf"
    mine.write_bytes(b"GGUF" + bytes(60))
    s.targets, s.drafters = [str(mine)], ["all", "draft-eagle3:eagle.gguf"]
    drafters, left = every_drafter(s)
    assert drafters[0] == "draft-eagle3:eagle.gguf" and "demo:dspark" not in drafters
    assert "draft-dspark (no drafter: give one as draft-dspark:FILE)" in left
    assert "draft-simple (no drafter: give one as draft-simple:FILE)" in left


def test_a_control_that_proves_nothing_is_not_counted_and_a_forking_reference_is_said(tmp_path, engine):
    doc = run_preset("llama-cpp-dspark", tmp_path, engine, plant="ngram-accepts-nothing")
    f = found(doc)
    assert f["ngram"]["outcome"] == "identical" and not f["ngram"]["evidence"]
    assert "with 0 of 0 drafted tokens accepted it proves nothing" in f["ngram"]["text"]
    together = [x for x in doc["summary"] if x.startswith("Together:")][0]
    assert "drafts from the text" not in together and together.startswith(
        "Together: plain decoding is deterministic and full-precision weights stay identical")

    doc = run_preset("llama-cpp-dspark", tmp_path, engine, plant="full-precision-forks")
    f = found(doc)["bf16"]
    assert f["outcome"] == "forks" and "forks on 3 of 3 prompts; first forks at token 8" in f["text"]
    assert "not only a quantization effect" in f["text"]
    together = [x for x in doc["summary"] if x.startswith("Together:")][0]
    assert "full-precision weights fork too, so the fork comes from batched verify passes, quantized weights or " \
           "not" in together and "quantized target's" not in together


def test_a_fork_the_diagnosis_reads_as_a_state_bug_is_named_in_the_conclusion(tmp_path, engine):
    doc = run_preset("llama-cpp-dspark", tmp_path, engine)
    for c in doc["cells"]:  # the diagnosis of the subject's fork said "state"
        if c["params"]["part"] == "dspark":
            c["verdict"] = "state"
    f = found(doc)["dspark"]
    assert f["verdicts"] == ["state"] and "forks at token 5 (state)" in f["text"]
    from specview.core.matrix.preset import conclusion

    together = conclusion(findings(doc))
    assert together.endswith("But the diagnosis reads the fork of dspark as a state bug, not numerics: report that "
                             "one with its trace.")


def test_a_matrix_over_every_spec_type_names_which_drafters_fork(engine, tmp_path):
    s = MatrixSpec(targets=["demo:Q4_K_M"], drafters=["all"], prompts=[PromptSpec("p", "hi")], p_min=[0.0],
                   backend="planted-server", max_tokens=16, diagnose=False)
    s.drafters, _ = every_drafter(s)
    run_matrix(s, Planted(), out=tmp_path / "types.json")
    summary = load_matrix(tmp_path / "types.json")["summary"]
    # the n-gram drafters other than ngram-simple drafted nothing here: they tested nothing and are set apart
    assert summary[1] == ("4 cells drafted nothing, so they tested nothing speculative and are left out below: the "
                          "drafter proposed no token for this text (4 cells: ngram-cache, ngram-map-k, ngram-map-k4v "
                          "and ngram-mod).")
    assert summary[2] == ("The drafter alone decides the outcome: all Q4_0, draft-eagle3, draft-dflash and "
                          "draft-dspark drafter cells fork; the ngram-simple drafter is identical everywhere.")
    # 4 forking drafters against the 1 identical one that drafted: 4 of the 10 pairs that differ in the drafter flip
    assert "drafter in 4 of 10 pairs" in summary[3] and not any("never does" in x for x in summary)


def test_a_preset_reports_the_command_that_runs_it_again(tmp_path, engine):
    import shlex

    from specview.cli import build_parser
    from specview.commands.matrix import spec_from_args
    from specview.core import report

    target = tmp_path / "mine Q4_K_M.gguf"  # a space: the command must quote it
    target.write_bytes(b"GGUF" + bytes(60))
    doc = run_preset("lfm2-draft", tmp_path, engine, quantized=str(target))
    md = report.matrix_markdown(doc)
    block = md.split("### Run this preset again\n\n```sh\n", 1)[1].split("\n```", 1)[0]
    assert block.startswith("specview matrix --preset lfm2-draft \\\n    --model ")
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["specview", "matrix"] and f"quantized={target}" in argv and argv[-2:] == ["-n", "16"]
    # the command, parsed as the CLI parses it, gives the same cells
    again = spec_from_args(build_parser().parse_args(argv[1:]))
    assert expand(again) == expand(MatrixSpec.from_json(doc["spec"]))
    assert "Run this preset again" in report.matrix_html(doc)


@pytest.mark.parametrize("argv, words", [
    (["--preset", "lfm2-draft", "-m", "demo:Q8_0"], "with a preset, give your models by role, --model ROLE=MODEL "
                                                    "(preset lfm2-draft: quantized: the quantized target"),
    (["--preset", "lfm2-draft", "--n-max", "2"], "preset lfm2-draft sets n_max part by part; to change it, copy "),
    (["--preset", "llama-cpp-dspark", "-fa", "off"], "preset llama-cpp-dspark sets flash_attn part by part"),
    (["--model", "draft=x.gguf"], "--model ROLE=MODEL puts a model in a preset's role: give --preset NAME too"),
    (["--preset", "lfm2-draft", "--model", "draft"], "--model 'draft': give ROLE=MODEL"),
    (["--preset", "lfm2-draft", "--config", "m.toml"], "--preset and --config both define the matrix: give one"),
])
def test_the_cli_refuses_what_would_break_a_presets_parts(argv, words, capsys, tmp_path):
    from specview import cli

    (tmp_path / "m.toml").write_text("targets = ['demo:Q8_0']\n")
    argv = [a if a != "m.toml" else str(tmp_path / "m.toml") for a in argv]
    assert cli.main(["matrix", *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_an_edited_copy_of_a_preset_runs_with_config(tmp_path, capsys):
    from specview import cli
    from specview.core.matrix.preset import PRESETS_DIR

    p = tmp_path / "mine.toml"
    p.write_text((PRESETS_DIR / "lfm2-draft.toml").read_text().replace("n_max = [1]", "n_max = [2]"))
    assert cli.main(["matrix", "--config", str(p), "--model", "reference=demo:BF16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "n-max-1: Q4_K_M · Q4_0 n_max=2 p_min=0" in out and "f16: BF16 · Q4_0" in out and "5 cells" in out


def test_an_axis_no_part_sets_applies_to_every_part(capsys):
    from specview import cli

    assert cli.main(["matrix", "--preset", "lfm2-draft", "-fa", "off", "-nr", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if ": " in x]
    assert len(lines) == 5 and all("fa=off · nr" in x for x in lines)


def test_this_machines_no_repack_default_reaches_every_part(monkeypatch, tmp_path, capsys):
    """Where llama.cpp's repacked kernels crashed here (the AMX probe), a preset's cells default to no repack."""
    from specview import cli
    from specview.backends.llama_cpp import probe

    monkeypatch.setenv("SPECVIEW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECVIEW_REPACK_PROBE", raising=False)  # the probe cache planted here, not the variable
    monkeypatch.setattr(probe, "probe_needed", lambda flags=None: True)
    probe.CACHE.put(probe.identity_key(probe.build_identity()), {"crashed": True, "signal": "SIGSEGV"})
    assert cli.main(["matrix", "--preset", "lfm2-draft", "--dry-run"]) == 0
    captured = capsys.readouterr()
    lines = [x for x in captured.out.splitlines() if ": " in x]
    assert len(lines) == 5 and all(" · nr · " in x for x in lines)
    assert "no repack" in captured.err
