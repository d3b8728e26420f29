"""One short quality run on the real demo model (a few items, few tokens): the table adds up to the items, every
item's trace carries its suite block, and an answer that changed carries its fork and a verdict."""

from __future__ import annotations

from specview.cli import main
from specview.core.quality import RESULT_FILE, QualityResult, item_trace, load_suite, quality_block, score
from specview.core.trace import Trace
from specview.core.verdicts import VERDICTS


def test_the_demo_on_a_few_arithmetic_items(tmp_path, demo_paths, capsys):
    rc = main(["quality", "--suite", "arithmetic", "-n", "3", "--max-tokens", "16", "-o", str(tmp_path), "-q"])
    res = QualityResult.load(tmp_path / RESULT_FILE)
    assert rc == (1 if res.discordant else 0)
    t = res.table
    assert res.status == "complete" and not res.errors
    assert t.n == 3 == t.both_pass + t.both_fail + t.only_vanilla + t.only_speculative
    suite = load_suite("arithmetic", 3)
    for item, o in zip(suite.items, res.items):
        trace = Trace.load(item_trace(tmp_path / RESULT_FILE, o))
        assert trace.prompt["text"] == item.prompt and trace.config["max_tokens"] == 16
        assert quality_block(trace)["item"] == item.id
        # each arm's recorded pass is its own text scored again, and identical arms pass or fail together
        assert score(item, trace.vanilla.text).passed == o.vanilla.passed == quality_block(trace)["vanilla_pass"]
        assert score(item, trace.speculative.text).passed == o.speculative.passed
        assert o.identical == trace.comparison.identical
        if o.identical:
            assert o.vanilla == o.speculative
    for o in res.discordant:  # the demo's forks are batched-vs-single numerics, never a state bug
        assert o.fork_index is not None and o.fork_context and o.verdict in VERDICTS and o.verdict != "state"
    assert "vanilla pass" in capsys.readouterr().out
