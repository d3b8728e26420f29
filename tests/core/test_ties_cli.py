"""``specview run`` prints the near-tie density its trace gives: on a tiny GGUF (an identical run), each band's
line says how many of the compared positions lie in it, counted here from the saved trace's top-k logits."""

from __future__ import annotations

import json

import numpy as np

from specview import cli


def test_run_prints_each_bands_count_of_the_saved_trace(capsys, tiny_dir, tmp_path):
    out_json = tmp_path / "t.json"
    code = cli.main(["run", "--target", str(tiny_dir / "target.gguf"), "--draft", str(tiny_dir / "draft.gguf"),
                     "--prompt", "the cat", "--no-chat", "--max-tokens", "24", "--ignore-eos", "--n-max", "3",
                     "-t", "1", "--json", str(out_json), "-q"])
    out = capsys.readouterr().out
    d = json.loads(out_json.read_text())
    assert code == (0 if d["comparison"]["identical"] else 1)
    vt, st = d["vanilla"]["tokens"], d["speculative"]["tokens"]
    fork = next((i for i in range(min(len(vt), len(st))) if vt[i] != st[i]), None)
    steps = d["vanilla"]["steps"][:len(vt) if fork is None else fork + 1]
    gaps = []
    for s in steps:
        lg = np.sort([x for x in s["top_logits"] if x is not None])[::-1]
        gaps.append(lg[0] - lg[1])
    block = out[out.index("near-tie density"):]
    assert f"{len(steps)} positions where both arms saw the same context" in block
    for name, width in (("0.125 nats", 0.125), ("0.5 nats", 0.5), ("2.0 logits", 2.0)):
        line = next(ln for ln in block.splitlines() if ln.strip().startswith(name))
        n = sum(g <= width for g in gaps)
        assert (f"of {n} flipped" in line) if n else ("no position in the band" in line), line
