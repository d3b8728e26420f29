"""One table across machines: the summaries of a folder of traces and fork cards, side by side.

:func:`gather` reads every trace (``*.json``) and fork card (``*.png``) in a folder, with the summary each
carries (:mod:`.summary`) checked against its checksum (and a trace's against the trace itself), or, for a trace
saved without one, computed from it.  :func:`cross_table` then keeps apart what is the same on every machine
(the models, the settings, and, where the machines agree, acceptance) from what is not (the machine, chip,
backend and build, exactness: the verdict, the fork and the tokens, and speed).  :func:`format_table` prints
it, :func:`cross_html` is one self-contained page.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecviewError
from .summary import SCHEMA, TRACE_KEY, check, png_summary, summary_of

#: flattened summary keys, by the group the table shows them in, with their column labels
GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("machine", (("machine.cpu", "CPU"), ("machine.os", "OS"), ("machine.arch", "arch"), ("chip", "chip"),
                 ("machine.cpu_features", "CPU features"))),
    ("backend", (("backend.engine", "engine"), ("backend.devices", "devices"), ("backend.ggml_backends", "ggml"))),
    ("build", (("build.llama_cpp_python", "llama-cpp-python"), ("build.llama_cpp_vendored_commit", "llama.cpp"),
               ("build.ggml_commit", "ggml commit"), ("build.ggml_version", "ggml"), ("build.llama_server", "server"),
               ("build.compiler", "compiler"), ("build.specview", "specview"))),
    ("inputs", ()),  # models, prompt and settings: every key under them
    ("acceptance", (("rates.drafted", "drafted"), ("rates.accepted", "accepted"),
                    ("rates.acceptance_rate", "acceptance"), ("rates.mean_accepted", "tokens/round"))),
    ("exactness", (("verdict", "verdict"), ("first_mismatch", "fork at"), ("tokens.vanilla", "vanilla tokens"),
                   ("tokens.vanilla_sha256", "vanilla #"), ("tokens.speculative", "spec. tokens"),
                   ("tokens.speculative_sha256", "spec. #"), ("rates.near_tie.positions", "positions"),
                   ("rates.near_tie.flips", "flips"), ("rates.near_tie.bands", "near-tie bands (in band/flipped)"))),
    ("speed", (("rates.vanilla_tok_s", "vanilla tok/s"), ("rates.speculative_tok_s", "spec. tok/s"),
               ("rates.speedup", "speedup"))),
)
INPUT_PREFIXES = ("models.", "prompt.", "settings.")
SKIP = {"schema", "checksum", "created"}
#: always a column of the per-machine table, so each row says which machine it is
ALWAYS = ("chip", "backend.engine", "verdict", "first_mismatch", "rates.speedup")


@dataclass
class Card:
    """One machine's summary: the file it came from, what it is, and whether its checksum holds."""

    source: str
    kind: str  # "trace" or "card"
    summary: dict[str, Any]
    status: str  # "verified", "edited", "unsealed"
    why: str | None = None


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (d.items() if isinstance(d, dict) else ()):
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not key.startswith("rates.near_tie.bands"):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_card(path: Path) -> Card | None:
    """The card a file holds; None for a file that is not a specview trace or card (a PNG without a summary)."""
    from ..trace import Trace, read_json

    if path.suffix.lower() == ".png":
        try:
            s = png_summary(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise SpecviewError(f"{path}: not a readable fork card ({exc})") from None
        if s is None:
            return None
        status, why = check(s)
        return Card(str(path), "card", s, status, why)
    d = read_json(path)
    if not isinstance(d, dict):
        return None
    if d.get("schema") == SCHEMA:
        status, why = check(d)
        return Card(str(path), "card", d, status, why)
    if not str(d.get("schema", "")).startswith("specview.trace/"):
        return None
    trace = Trace.from_json(d, source=str(path))
    carried = trace.extra.get(TRACE_KEY)
    if carried is None:
        return Card(str(path), "trace", summary_of(trace), "unsealed", "saved without a summary: read from the trace")
    status, why = check(carried, trace)
    return Card(str(path), "trace", carried if isinstance(carried, dict) else summary_of(trace), status, why)


def gather(folder: str | os.PathLike[str]) -> tuple[list[Card], list[str]]:
    """The cards of every trace and fork card under ``folder`` (sorted by path), and the files skipped, with why."""
    root = Path(folder)
    if not root.is_dir():
        raise SpecviewError(f"{root}: not a folder; give a folder of traces and fork cards from several machines")
    cards, skipped = [], []
    for p in sorted(x for x in root.rglob("*") if x.is_file() and x.suffix.lower() in (".json", ".png")):
        try:
            c = read_card(p)
        except SpecviewError as exc:
            skipped.append(f"{p}: {str(exc).removeprefix(str(p) + ': ')}")
            continue
        if c is None:
            skipped.append(f"{p}: neither a specview trace nor a fork card with a summary")
        else:
            cards.append(c)
    if not cards:
        raise SpecviewError(f"{root}: no specview trace or fork card in it (saved with `specview run --json` or "
                            "`specview report --card`)")
    return cards, skipped


def value_text(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return ", ".join(value_text(x) for x in v) or "–"
    if isinstance(v, dict):  # the near-tie bands: {band: [positions in it, flipped]}
        return "; ".join(f"{k} {'/'.join(map(str, x)) if isinstance(x, list) else value_text(x)}"
                         for k, x in sorted(v.items()))
    return str(v)


@dataclass
class CrossTable:
    cards: list[Card]
    common: list[tuple[str, str, str]]  # (group, key, value) the same on every card
    columns: list[tuple[str, str, str]]  # (group, key, label) that differ (plus ALWAYS)
    rows: list[list[str]]  # per card: the values of columns

    @property
    def exact_everywhere(self) -> bool:
        """Whether every card's arms give the same tokens as every other's (vanilla and speculative)."""
        keys = ("tokens.vanilla_sha256", "tokens.speculative_sha256")
        return all(len({str(_flatten(c.summary).get(k)) for c in self.cards}) == 1 for k in keys)


def _group_of(key: str) -> str:
    for g, keys in GROUPS:
        if any(k == key for k, _ in keys):
            return g
    if key.startswith(INPUT_PREFIXES):
        return "inputs"
    return "other"


def _label(key: str) -> str:
    for _, keys in GROUPS:
        for k, lab in keys:
            if k == key:
                return lab
    return key


def cross_table(cards: list[Card]) -> CrossTable:
    flat = [_flatten(c.summary) for c in cards]
    keys = sorted({k for f in flat for k in f} - SKIP)
    order = {g: i for i, (g, _) in enumerate(GROUPS)}
    pos = {k: i for _, ks in GROUPS for i, (k, _) in enumerate(ks)}
    keys.sort(key=lambda k: (order.get(_group_of(k), 99), pos.get(k, 99), k))
    common, columns = [], []
    for k in keys:
        vals = {value_text(f.get(k)) for f in flat}
        if len(vals) == 1 and len(cards) > 1 and k not in ALWAYS:
            v = vals.pop()
            if v != "–":  # a fact no card records says nothing
                common.append((_group_of(k), k, v))
        else:
            columns.append((_group_of(k), k, _label(k)))
    rows = [[value_text(f.get(k)) for _, k, _ in columns] for f in flat]
    return CrossTable(cards, common, columns, rows)


def _status_text(c: Card) -> str:
    return {"verified": "checksum ok", "edited": "EDITED", "unsealed": "no checksum"}[c.status]


def format_table(t: CrossTable, skipped: Iterable[str] = ()) -> str:
    """The table as text: what every machine shares, then one row per machine of what differs, by group."""
    n = len(t.cards)
    machines = {json.dumps(c.summary.get("machine"), sort_keys=True) + str(c.summary.get("chip")) for c in t.cards}
    lines = [f"{n} run(s) from {len(machines)} machine setting(s)", ""]
    if t.common:
        lines.append("the same on every machine:")
        group = None
        for g, k, v in t.common:
            if g != group:
                lines.append(f"  {g}")
                group = g
            lines.append(f"    {_label(k):<34} {v[:90]}")
        lines.append("")
    lines.append("by machine (what differs):")
    head = ["#", "file", "checksum"] + [lab for _, _, lab in t.columns]
    body = [[str(i + 1), Path(c.source).name, _status_text(c)] + [v[:56] for v in row]
            for i, (c, row) in enumerate(zip(t.cards, t.rows))]
    widths = [max(len(r[j]) for r in [head, *body]) for j in range(len(head))]
    groups = ["", "", ""] + [g for g, _, _ in t.columns]
    lines.append("  " + "  ".join(g.ljust(w) if i == 0 or groups[i] != groups[i - 1] else " " * w
                                  for i, (g, w) in enumerate(zip(groups, widths))).rstrip())
    for r in [head, *body]:
        lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    edited = [c for c in t.cards if c.status == "edited"]
    for c in edited:
        lines.append(f"EDITED  {c.source}: {c.why}")
    for c in t.cards:
        if c.status == "unsealed":
            lines.append(f"note    {c.source}: {c.why}")
    for s in skipped:
        lines.append(f"skipped {s}")
    lines.append("")
    lines.append("exactness: every machine gives the same tokens in both arms" if t.exact_everywhere else
                 "exactness: the machines' tokens differ (see the # columns)")
    return "\n".join(lines)


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1f2328}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}
tr.edited td{background:#ffebe9}.g{font-size:12px;color:#57606a;text-transform:uppercase}code{font-size:12px}
.bad{color:#cf222e;font-weight:600}.ok{color:#1a7f37}"""


def cross_html(t: CrossTable, skipped: Iterable[str] = ()) -> str:
    """One self-contained page (no script, no network): the common facts, then the per-machine table."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>specview: one table across machines</title>",
           f"<style>{CSS}</style></head><body>",
           f"<h1>Speculative decoding across {len(t.cards)} run(s)</h1>",
           "<p>" + e("Every machine gives the same tokens in both arms." if t.exact_everywhere else
                     "The machines' tokens differ: see the exactness columns.") + "</p>"]
    if t.common:
        out.append("<h2>The same on every machine</h2><table><tr><th>group</th><th>fact</th><th>value</th></tr>")
        out += [f"<tr><td class='g'>{e(g)}</td><td>{e(_label(k))}</td><td><code>{e(v)}</code></td></tr>"
                for g, k, v in t.common]
        out.append("</table>")
    out.append("<h2>By machine</h2><table><tr><th></th><th></th><th></th>")
    spans: list[tuple[str, int]] = []
    for g, _, _ in t.columns:
        if spans and spans[-1][0] == g:
            spans[-1] = (g, spans[-1][1] + 1)
        else:
            spans.append((g, 1))
    out += [f"<th class='g' colspan='{n}'>{e(g)}</th>" for g, n in spans]
    out.append("</tr><tr><th>#</th><th>file</th><th>checksum</th>"
               + "".join(f"<th>{e(lab)}</th>" for _, _, lab in t.columns) + "</tr>")
    for i, (c, row) in enumerate(zip(t.cards, t.rows)):
        cls = " class='edited'" if c.status == "edited" else ""
        st = (f"<span class='bad' title='{e(c.why or '')}'>EDITED</span>" if c.status == "edited" else
              "<span class='ok'>ok</span>" if c.status == "verified" else f"<span title='{e(c.why or '')}'>none</span>")
        out.append(f"<tr{cls}><td>{i + 1}</td><td>{e(Path(c.source).name)}</td><td>{st}</td>"
                   + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>")
    out.append("</table>")
    notes = [f"EDITED {c.source}: {c.why}" for c in t.cards if c.status == "edited"]
    notes += [f"skipped {s}" for s in skipped]
    if notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


__all__ = ["Card", "CrossTable", "cross_html", "cross_table", "format_table", "gather", "read_card"]
