"""One table across machines: a run's sealed summary, carried by its trace and its fork card, gathered from a folder
by ``specview compare DIR``, with what every machine shares kept apart from what differs, and an edited card marked.

The two machine settings are traces of real shape (the report tests' planted fork), one with repacked weights on a
CPU, one without and another CPU, whose speculative arms fork at different tokens, as the demo does under
``no_repack`` True and False on CPUs that can repack; plus a fork card that carries its summary in the PNG."""

from __future__ import annotations

import json
import struct
import zlib
from html.parser import HTMLParser

from test_report_issue import make_trace

from specview import cli
from specview.core.report.crossmachine import cross_table, gather
from specview.core.report.summary import (
    PNG_KEY,
    SCHEMA,
    check,
    png_chunks,
    png_summary,
    png_with_summary,
    sealed_summary,
    summary_of,
    tokens_fingerprint,
)
from specview.core.trace import Trace


def machine(fork: int, *, no_repack: bool, cpu: str, speed: float):
    t = make_trace(n=48, fork=fork, no_repack=no_repack)
    t.environment["cpu"] = cpu
    t.speculative.gen_ms = speed
    t.extra["summary"] = sealed_summary(t)
    return t


def tiny_png() -> bytes:
    """A 1x1 grey PNG written by hand (the card renderer's output is a PNG like any other)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x80"))
            + chunk(b"IEND", b""))


def test_a_summary_holds_the_runs_facts_and_its_checksum_catches_an_edit():
    t = machine(20, no_repack=True, cpu="Xeon", speed=100.0)
    s = t.extra["summary"]
    assert s["schema"] == SCHEMA and s["checksum"].startswith("sha256:")
    assert s["first_mismatch"] == 20 and s["verdict"] == "near-tie"
    assert s["tokens"]["speculative_sha256"] == tokens_fingerprint(t.speculative.tokens)
    assert s["tokens"]["vanilla_sha256"] != s["tokens"]["speculative_sha256"]
    assert s["models"]["target"]["sha256"] == "ab" * 32 and s["settings"]["no_repack"] is True
    assert s["rates"]["drafted"] == t.speculative.n_drafted and s["rates"]["accepted"] == t.speculative.n_accepted
    assert s["rates"]["speedup"] == round(t.speculative.tokens_per_s / t.vanilla.tokens_per_s, 3)
    assert check(s, t) == ("verified", None)
    edited = json.loads(json.dumps(s))
    edited["rates"]["speedup"] = 9.99
    assert check(edited)[0] == "edited"
    # the trace changed under a summary left alone: its content no longer gives the summary
    t.speculative.tokens[30] = 5
    t.speculative.steps[30].token = 5
    status, why = check(s, t)
    assert status == "edited" and "tokens" in why
    assert check({k: v for k, v in s.items() if k != "checksum"})[0] == "unsealed"


def test_a_fork_card_carries_its_summary_in_the_png():
    s = sealed_summary(machine(20, no_repack=True, cpu="Xeon", speed=100.0))
    png = png_with_summary(tiny_png(), s)
    kinds = [k for k, _ in png_chunks(png)]
    assert kinds == [b"IHDR", b"IDAT", b"iTXt", b"IEND"]
    for kind, data in png_chunks(png):  # every chunk's CRC holds: any PNG reader still opens the card
        raw = png[png.index(kind + data) - 4:]
        n = struct.unpack(">I", raw[:4])[0]
        assert struct.unpack(">I", raw[8 + n:12 + n])[0] == zlib.crc32(kind + data)
    assert png_summary(png) == s and png_summary(tiny_png()) is None
    again = png_with_summary(png, {**s, "verdict": "x"})  # a second summary replaces the first
    assert [k for k, _ in png_chunks(again)].count(b"iTXt") == 1 and png_summary(again)["verdict"] == "x"
    assert next(d for k, d in png_chunks(png) if k == b"iTXt").startswith(PNG_KEY.encode() + b"\0")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text, self.rows = [], [], 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.rows += tag == "tr"

    def handle_data(self, data):
        self.text.append(data)


def test_compare_over_two_machine_settings_prints_one_table_and_writes_one_page(tmp_path, capsys):
    folder = tmp_path / "cards"
    folder.mkdir()
    a = machine(20, no_repack=True, cpu="Intel Xeon (AMX)", speed=100.0)
    b = machine(31, no_repack=False, cpu="AMD EPYC", speed=300.0)
    a.save(folder / "xeon.json")
    b.save(folder / "epyc.json")
    (folder / "epyc-card.png").write_bytes(png_with_summary(tiny_png(), b.extra["summary"]))
    doc = json.loads((folder / "xeon.json").read_text())
    doc["summary"]["first_mismatch"] = 40  # someone "fixed" the fork position by hand
    (folder / "xeon-edited.json").write_text(json.dumps(doc))
    (folder / "notes.json").write_text("{}")  # not a specview file: skipped, said so

    code = cli.main(["compare", str(folder)])
    out = capsys.readouterr().out
    assert code == 1  # the machines' tokens differ, and a card is edited
    common, _, per_machine = out.partition("by machine (what differs):")
    # the same on every machine: the models, the prompt and the acceptance (both draft the same way)
    for s in ("ab" * 32, "models.target.quantization", "acceptance", f"{a.speculative.n_drafted}"):
        assert s in common, s
    assert "no_repack" not in common and "settings.no_repack" in per_machine
    rows = {ln.split()[1]: ln for ln in per_machine.splitlines() if ln[:4].strip().isdigit()}
    assert set(rows) == {"epyc-card.png", "epyc.json", "xeon-edited.json", "xeon.json"}
    assert "EDITED" in rows["xeon-edited.json"] and "checksum ok" in rows["xeon.json"]
    assert "checksum ok" in rows["epyc-card.png"] and " 31 " in rows["epyc-card.png"]
    assert " 20 " in rows["xeon.json"] and "AMD EPYC" in rows["epyc.json"]
    assert "EDITED  " + str(folder / "xeon-edited.json") in out and "notes.json" in out
    assert "exactness: the machines' tokens differ" in out

    page = (folder / "compare.html").read_text()
    p = _Page()
    p.feed(page)
    assert not any(tag in ("script", "link", "img", "iframe") for tag, _ in p.tags)  # self-contained, inert
    common_rows = len(cross_table(gather(folder)[0]).common)
    assert "http" not in page and p.rows == 1 + common_rows + 2 + 4  # each table's headers, then its rows
    assert "EDITED" in "".join(p.text)


def test_the_same_run_on_every_machine_is_exact_everywhere(tmp_path, capsys):
    for i, cpu in enumerate(("Xeon", "EPYC")):
        machine(20, no_repack=True, cpu=cpu, speed=100.0 + 50 * i).save(tmp_path / f"{i}.json")
    assert cli.main(["compare", str(tmp_path), "--html", str(tmp_path / "page.html")]) == 0
    out = capsys.readouterr().out
    assert "exactness: every machine gives the same tokens in both arms" in out
    assert (tmp_path / "page.html").exists() and not (tmp_path / "compare.html").exists()


def test_a_trace_saved_without_a_summary_is_read_but_not_vouched_for(tmp_path, capsys):
    t = make_trace()
    t.save(tmp_path / "old.json")
    cards, _ = gather(tmp_path)
    assert [c.status for c in cards] == ["unsealed"] and cards[0].summary == summary_of(Trace.load(tmp_path / "old.json"))


def test_compare_refuses_what_it_cannot_read(tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path)]) == 2
    assert "no specview trace or fork card" in capsys.readouterr().err
    (tmp_path / "a.json").write_text("{}")
    assert cli.main(["compare", str(tmp_path / "a.json")]) == 2
    assert "give two traces" in capsys.readouterr().err
    broken = tmp_path / "b.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xffIDAT")
    make_trace().save(tmp_path / "t.json")
    assert cli.main(["compare", str(tmp_path)]) == 0  # one run: exact; the broken card is skipped, and said so
    out = capsys.readouterr().out
    assert "skipped " + str(broken) in out and "not a readable fork card" in out


def test_a_real_runs_trace_is_sealed_and_sits_in_one_table_with_another_machines(tmp_path, capsys, tiny_target,
                                                                                  tiny_draft):
    """One real run (a tiny llama.cpp model, in specview's worker) saved by `specview run --json`: sealed, its model
    hashes the files' own; beside it the same run as another machine with repacking on would record it."""
    import hashlib

    folder = tmp_path / "real"
    folder.mkdir()
    code = cli.main(["run", "-m", str(tiny_target), "-md", str(tiny_draft), "-p", "the cat sat on the", "--no-chat",
                     "--ignore-eos", "-n", "12", "-t", "1", "--no-diagnose", "--json", str(folder / "here.json"), "-q"])
    assert code in (0, 1)
    capsys.readouterr()
    t = Trace.load(folder / "here.json")
    s = t.extra["summary"]
    assert check(s, t) == ("verified", None)
    target_sha = hashlib.sha256(tiny_target.read_bytes()).hexdigest()
    assert s["models"]["target"]["sha256"] == target_sha
    assert s["models"]["draft"]["sha256"] == hashlib.sha256(tiny_draft.read_bytes()).hexdigest()
    assert s["settings"]["threads"] == 1 and s["tokens"]["vanilla"] == 12
    other = Trace.load(folder / "here.json")
    other.environment["cpu"] = "AMD EPYC 9004"
    other.config["engine"]["no_repack"] = not t.config["engine"].get("no_repack")
    other.extra["summary"] = sealed_summary(other)
    other.save(folder / "there.json")
    assert cli.main(["compare", str(folder)]) == 0  # the same tokens on both
    out = capsys.readouterr().out
    common, _, per_machine = out.partition("by machine (what differs):")
    assert target_sha in common and "settings.no_repack" in per_machine and "AMD EPYC 9004" in per_machine
    assert out.count("checksum ok") == 2


def test_report_card_writes_the_runs_sealed_summary_into_the_card(tmp_path):
    from specview.core.report.write import write_report

    t = machine(20, no_repack=True, cpu="Xeon", speed=100.0)
    written = write_report(t, tmp_path / "out", card=lambda trace: tiny_png())
    card = written["card"].read_bytes()
    assert png_summary(card) == sealed_summary(t) and check(png_summary(card)) == ("verified", None)
    cards, _ = gather(tmp_path / "out")
    assert [(c.kind, c.status) for c in cards] == [("card", "verified")]


def test_a_summary_sealed_before_saving_is_verified_after_loading(tmp_path):
    """The file rounds logits to 5 decimals: a margin on a tie band's edge moves, and the summary must not."""
    t = machine(20, no_repack=True, cpu="Xeon", speed=100.0)
    for st in t.vanilla.steps:  # margins a hair over 0.5 nats, which the file rounds onto the band's edge
        st.top_logits = [5.0, 5.0 - 0.5000004]
        st.margin = 0.5000004
    t.extra["summary"] = sealed_summary(t)
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert check(back.extra["summary"], back) == ("verified", None)
