"""The report of a quality run (``specview.quality/1``): the 2x2 table, the rates and the test, the changed answers.

Its sections (:func:`quality_sections`) are drawn by the same writers as every
other report, in kinds they already know (a summary, tables, facts), so the
HTML and the Markdown say the same; the sentences come from
:mod:`specview.core.quality.text`, as the CLI's do.
"""

from __future__ import annotations

from typing import Any

from ... import __version__
from ..quality.result import QualityResult
from ..quality.text import OUTCOME_WORDS, p_text, pct, rate_text, reading, verdict_counts
from ..verdicts import words
from .outline import Section, environment_section
from .quality import near_tie_table, sandbox_rows

TABLE_HEADERS = ("", "speculative passes", "speculative fails", "total")
ITEM_HEADERS = ("item", "outcome", "expected", "vanilla read", "speculative read", "fork at", "around the fork",
                "verdict", "trace")


def title(res: QualityResult) -> str:
    cfg = res.config
    return f"{res.suite.name} on {cfg.get('target')} ({cfg.get('spec_type')}, n_max {cfg.get('n_max')})"


def table_rows(res: QualityResult) -> list[tuple[str, ...]]:
    """The 2x2 table with its margins, as strings."""
    t = res.table
    return [("vanilla passes", str(t.both_pass), str(t.only_vanilla), str(t.both_pass + t.only_vanilla)),
            ("vanilla fails", str(t.only_speculative), str(t.both_fail), str(t.only_speculative + t.both_fail)),
            ("total", str(t.both_pass + t.only_speculative), str(t.only_vanilla + t.both_fail), str(t.n))]


def figure_rows(res: QualityResult) -> list[tuple[str, str]]:
    t = res.table
    identical = sum(1 for o in res.items if o.identical and o.error is None)
    rows = [("vanilla pass rate", rate_text(res.vanilla_rate)),
            ("speculative pass rate", rate_text(res.spec_rate)),
            ("McNemar's exact test", f"p = {p_text(res.p_mcnemar)} ({t.only_vanilla} only vanilla, "
                                     f"{t.only_speculative} only speculative)"),
            ("identical texts", f"{identical} of {t.n} ({pct(identical / t.n if t.n else None)})"),
            ("forks", ", ".join(f"{n} {v}" for v, n in verdict_counts(res.items).items()) or "none")]
    if res.errors:
        rows.append(("items not run", f"{len(res.errors)} (outside the table)"))
    return rows


def short(text: str | None, n: int = 60) -> str:
    """What an arm's reply was read as, cut to ``n`` characters (a reply read whole can be long)."""
    if not text:
        return "—"
    return text if len(text) <= n else text[:n - 1] + "…"


def item_rows(items: list[Any], suite: Any) -> list[tuple[str, ...]]:
    expected = {it.id: it.expected for it in suite.items}
    rows = []
    for o in items:
        rows.append((o.item_id, OUTCOME_WORDS[o.outcome], short(expected.get(o.item_id, "")),
                     short(o.vanilla.got), short(o.speculative.got), "" if o.fork_index is None else str(o.fork_index),
                     o.fork_context or "identical texts",
                     words(o.verdict) if o.verdict else ("diagnosis failed" if o.diagnosis_error else "—"),
                     o.trace_path or ""))
    return rows


def setting_rows(res: QualityResult) -> list[tuple[str, str]]:
    cfg, s = res.config, res.suite
    keys = ("target", "draft", "spec_type", "n_max", "n_min", "p_min", "max_tokens", "chat", "backend")
    rows = [("suite", f"{s.name}: {len(s.items)} items" + (f", seed {s.seed}" if s.seed is not None else "")),
            ("source", s.source), ("status", res.status), ("code executed", "yes" if res.execute else "no")]
    rows += [(k, str(cfg.get(k))) for k in keys if k in cfg]
    eng = cfg.get("engine") if isinstance(cfg.get("engine"), dict) else {}
    rows += [(k, str(v)) for k, v in eng.items() if v not in (None, "", [])]
    return rows


def quality_sections(res: QualityResult) -> list[Section]:
    """The report of a quality run, after its title: what it shows, the table, the figures, the changed answers,
    each arm's near-tie density, the other forks, how it was run."""
    out = [Section("summary", reading(res), "What it shows"),
           Section("table", (TABLE_HEADERS, table_rows(res)), "Paired outcomes"),
           Section("facts", figure_rows(res), "Pass rates and the paired test", head=("figure", "value"))]
    changed = res.discordant
    if changed:
        out.append(Section("table", (ITEM_HEADERS, item_rows(changed, res.suite)), "Answers that changed"))
    ties = near_tie_table(res)
    if ties is not None:
        out += [Section("table", ties[:2], "Near-tie density"), Section("paragraph", ties[2])]
    forked = [o for o in res.items if o.fork_index is not None and not o.discordant and o.error is None]
    if forked:
        out.append(Section("table", (ITEM_HEADERS, item_rows(forked, res.suite)),
                           "Forks that left the outcome alone", folded=True, head=("", "")))
    if res.errors:
        out.append(Section("table", (("item", "error"), [(o.item_id, o.error or "") for o in res.errors]),
                           "Items not run"))
    out.append(Section("facts", setting_rows(res), "Settings", folded=True, head=("setting", "value")))
    if sandbox_rows(res.sandbox):
        out.append(Section("facts", sandbox_rows(res.sandbox), "The sandbox the code ran in", folded=True,
                           head=("fence", "here")))
    out.append(environment_section(res.environment))
    return out


def quality_html(res: QualityResult) -> str:
    from .escape import esc
    from .html import HtmlWriter, _page

    parts = [f"<h1>specview quality: {esc(title(res))}</h1>",
             f"<div class=sub>specview {esc(res.environment.get('specview', __version__))} · {esc(res.created)} · "
             f"engine {esc(res.config.get('backend', ''))}</div>"]
    parts += HtmlWriter().draw(quality_sections(res))
    return _page("specview quality", "\n".join(parts))


def quality_markdown(res: QualityResult) -> str:
    from .escape import md_text
    from .markdown import MarkdownWriter, made_with

    out = [f"## specview quality: {md_text(title(res))}\n"]
    out += MarkdownWriter().draw(quality_sections(res))
    out.append(made_with(res.environment.get("specview", __version__)))
    return "\n".join(out)


__all__ = ["quality_html", "quality_markdown", "quality_sections", "table_rows", "title"]
