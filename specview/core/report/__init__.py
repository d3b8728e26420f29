"""Shareable bug reports: a self-contained HTML page and a GitHub-ready Markdown file.

Qt-free: a trace (or a matrix document) and already rendered PNG plots become text.

* :mod:`.escape`    escaping untrusted text (tokens, prompts, paths) for HTML and Markdown
* :mod:`.facts`     the facts both formats state
* :mod:`.outline`   what each report says, in what order: the sections both formats draw
* :mod:`.html`      the HTML report
* :mod:`.markdown`  the Markdown report
* :mod:`.locate`    the report of a locate
* :mod:`.kernels`   the kernel map in reports: a trace's prediction, a matrix's citation, a map's own report
* :mod:`.write`     writing both to a folder, with plots from a renderer passed in
"""

from __future__ import annotations

from ..llama_flags import llama_commands, ngl_text
from .escape import esc, md_code, md_fence, md_text, visible
from .facts import PLOT_CAPTIONS, earliest_fork, fork_context, headline, trace_title, verdict_facts, verdict_of
from .html import kernels_html, matrix_html, rates_html, trace_html
from .kernels import trace_kernel_section
from .markdown import kernels_markdown, matrix_markdown, rates_md, trace_markdown
from .write import read_input, write_report

__all__ = [
    "llama_commands", "ngl_text", "esc", "md_code", "md_fence", "md_text",
    "visible", "PLOT_CAPTIONS", "earliest_fork", "fork_context", "headline", "trace_title", "verdict_facts",
    "verdict_of", "matrix_html", "rates_html", "trace_html", "matrix_markdown", "rates_md", "trace_markdown",
    "read_input", "write_report", "kernels_html", "kernels_markdown", "trace_kernel_section",
]
