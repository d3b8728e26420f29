"""Writing a report to a folder: ``report.html``, ``report.md`` and the PNG plots the Markdown links to.

The input is a trace, a matrix, a kernel map (``specview.kernels/1``), a locate (``specview.locate/1``) or a
quality run (``specview.quality/1``);
a trace's report can carry the kernel map's prediction for its run (``kernel_map=``).

Qt-free: the plots come from a renderer passed in, a callable ``trace ->
{name: PNG bytes}`` (the app's own plot widgets draw them, in
:mod:`specview.gui.export`); without one the report has no plots.  The names
a renderer may return are the keys of :data:`~specview.core.report.facts.PLOT_CAPTIONS`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import SpecviewError
from ..trace import SCHEMA as TRACE_SCHEMA, Trace, write_atomic
from .facts import PLOT_CAPTIONS, earliest_fork
from .html import kernels_html, matrix_html, trace_html
from .kernels import cite_in_matrix, trace_kernel_section
from .locate import locate_html, locate_markdown
from .markdown import kernels_markdown, matrix_markdown, trace_markdown

PlotRenderer = Callable[[Trace], Mapping[str, bytes]]
#: draws a trace's fork card (PNG bytes); the app's is :func:`specview.gui.card.fork_card_png`
CardRenderer = Callable[[Trace], bytes]
CARD_FILE = "fork-card.png"


def read_input(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """("trace", Trace), ("matrix", dict), ("kernels", KernelMap), ("locate", Located) or ("quality",
    QualityResult) from a JSON file, refusing anything else."""
    from ..kernels.evidence import kernel_map_from_json
    from ..matrix import validate_matrix
    from ..jsonfile import read_json, schema_of

    p = Path(path)
    d = read_json(p)
    schema = d.get("schema") if isinstance(d, dict) else None
    if isinstance(schema, str) and schema.startswith("specview.matrix/"):
        validate_matrix(d, source=str(p))
        return "matrix", d
    if isinstance(schema, str) and schema.startswith("specview.trace/"):
        return "trace", Trace.from_json(d, source=str(p))
    if isinstance(schema, str) and schema.startswith("specview.kernels/"):
        return "kernels", kernel_map_from_json(d, source=str(p))
    if isinstance(schema, str) and schema.startswith("specview.locate/"):
        from ..locate.find import Located

        return "locate", Located.from_json(d, source=str(p))
    if isinstance(schema, str) and schema.startswith("specview.quality/"):
        from ..quality import QualityResult

        return "quality", QualityResult.from_dict(d, source=str(p))
    raise SpecviewError(f"{p}: neither a specview trace ({TRACE_SCHEMA}), a matrix (specview.matrix/1), a "
                        f"kernel map (specview.kernels/1), a locate (specview.locate/1) nor a quality run "
                        f"(specview.quality/1): {schema_of(d)}")


def _with_summary(png: bytes, trace: Trace) -> bytes:
    """The fork card with the run's sealed summary in it (:mod:`.summary`), for ``specview compare DIR``."""
    from .summary import png_with_summary, sealed_summary

    try:
        return png_with_summary(png, sealed_summary(trace))
    except ValueError:  # a renderer that drew something other than a PNG: keep what it drew
        return png


def earliest_fork_trace(doc: dict, source: Path | None) -> Trace | None:
    """The saved trace of the matrix's earliest fork (``--traces``), or None when there is none to read."""
    cell = earliest_fork(doc)
    if cell is None or not cell.get("trace"):
        return None
    p = Path(cell["trace"])
    if not p.is_absolute() and source is not None:
        p = source.parent / p
    try:
        return Trace.load(p)
    except (SpecviewError, OSError, ValueError):
        return None


def write_issue(src: str | os.PathLike[str] | Trace, out_dir: str | os.PathLike[str], *, name: str = "report",
                kernel_map: str | os.PathLike[str] | Any = None) -> dict[str, Path]:
    """Write ``{name}-issue.md``, the body of an upstream issue (:mod:`.issue`), and the request its reproduction
    sends (``request.json``) into ``out_dir``; returns them by kind ("issue", "request")."""
    from .issue import REQUEST_FILE, issue_markdown
    from .repro import reproduction

    if isinstance(src, Trace):
        trace = src
    else:
        kind, trace = read_input(src)
        if kind != "trace":
            raise SpecviewError(f"--issue: {src} is a {kind} file; an issue is written from a trace "
                                "(specview run --json TRACE.json)")
    _plain_name(name)
    section = None
    if kernel_map is not None:
        from ..kernels.evidence import load_kernel_map
        from ..kernels.map import KernelMap

        kmap = kernel_map if isinstance(kernel_map, KernelMap) else load_kernel_map(kernel_map, what="--kernel-map")
        section = trace_kernel_section(trace, kmap, None if isinstance(kernel_map, KernelMap) else str(kernel_map))
    body, _ = issue_markdown(trace, kernel=section)
    out = _folder(out_dir)
    written = {"issue": write_atomic(out / f"{name}-issue.md", body)}
    try:
        rp = reproduction(trace)
    except SpecviewError:
        return written
    written["request"] = write_atomic(out / REQUEST_FILE, json.dumps(rp.body, separators=(",", ":")) + "\n")
    return written


def _plain_name(name: str) -> None:
    if "/" in name or "\\" in name or name in ("", ".", ".."):
        raise SpecviewError(f"--name {name!r}: give a plain file name, without a folder")


def _folder(out_dir: str | os.PathLike[str]) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecviewError(f"-o {out}: cannot create the folder ({exc.strerror or exc})") from None
    try:  # a folder that takes no files (/proc, read-only) is refused before any page or plot is made
        fd, probe = tempfile.mkstemp(prefix=".specview-", suffix=".tmp", dir=out)
    except OSError as exc:
        raise SpecviewError(f"-o {out}: cannot write files in this folder ({exc.strerror or exc}); choose another") \
            from None
    os.close(fd)
    os.unlink(probe)
    return out


def _classify(src: Any) -> tuple[str, Any]:
    """(kind, the object) of a report's input: "trace", "kernels", "locate", "quality" or "matrix"."""
    from ..kernels.map import KernelMap
    from ..locate.find import Located
    from ..matrix import validate_matrix
    from ..quality import QualityResult

    if isinstance(src, Trace):
        return "trace", src
    if isinstance(src, KernelMap):
        return "kernels", src
    if isinstance(src, Located):
        return "locate", src
    if isinstance(src, QualityResult):
        return "quality", src
    if isinstance(src, dict):
        validate_matrix(src)
        return "matrix", src
    return read_input(src)


def _kernel_map(kernel_map: Any, kind: str) -> tuple[Any, str | None]:
    """(the KernelMap, its file) a report of ``kind`` cites, or (None, None) when none was given."""
    if kernel_map is None:
        return None, None
    if kind in ("kernels", "locate", "quality"):
        what = {"kernels": "kernel map already", "locate": "locate", "quality": "quality run"}[kind]
        raise SpecviewError(f"--kernel-map: the input is a {what}; its report takes no kernel map")
    from ..kernels.evidence import load_kernel_map
    from ..kernels.map import KernelMap

    if isinstance(kernel_map, KernelMap):
        return kernel_map, None
    return load_kernel_map(kernel_map, what="--kernel-map"), str(kernel_map)


def _write_pictures(obj: Any, kind: str, out: Path, name: str, plots: PlotRenderer | None,
                    card: CardRenderer | None, card_path: Any, written: dict[str, Path]
                    ) -> tuple[dict[str, bytes], dict[str, str], str | None]:
    """Write a trace's (or a locate's) plots and a trace's fork card into ``out``: (the PNGs by key, their file
    names by key, the card's path relative to ``out`` or None), each file also recorded in ``written``."""
    wanted = ("locate",) if kind == "locate" else PLOT_CAPTIONS
    pngs = {k: v for k, v in (plots(obj) if plots is not None else {}).items() if k in wanted}
    files = {}
    for key, png in pngs.items():
        fname = f"{name}-{key}.png"
        try:
            (out / fname).write_bytes(png)
        except OSError as exc:
            raise SpecviewError(f"-o {out}: cannot write {fname} ({exc.strerror or exc})") from None
        written[key] = out / fname
        files[key] = fname
    card_ref = None
    if card is not None and kind == "trace":
        cp = Path(card_path) if card_path is not None else out / CARD_FILE
        png = card(obj)
        if png:
            png = _with_summary(png, obj)
            try:
                cp.write_bytes(png)
            except OSError as exc:
                raise SpecviewError(f"--card {cp}: cannot write the fork card ({exc.strerror or exc})") from None
            written["card"] = cp
            card_ref = Path(os.path.relpath(cp.resolve(), out.resolve())).as_posix()
    return pngs, files, card_ref


def write_report(src: str | os.PathLike[str] | Trace | dict | Any, out_dir: str | os.PathLike[str], *,
                 name: str = "report", plots: PlotRenderer | None = None, card: CardRenderer | None = None,
                 card_path: str | os.PathLike[str] | None = None,
                 kernel_map: str | os.PathLike[str] | Any = None) -> dict[str, Path]:
    """Write ``{name}.html``, ``{name}.md`` and the PNGs the Markdown links to into ``out_dir``.

    ``src`` is a trace, a matrix document, a :class:`~specview.core.kernels.map.KernelMap` or a file
    holding one.  ``plots`` draws a trace's plots (called once, on the caller's thread); a matrix
    report has none.  ``card`` draws a trace's fork card, written to ``card_path`` (default
    ``fork-card.png`` in ``out_dir``) and shown at the top of the Markdown report.
    ``kernel_map`` (a map file, or a KernelMap) adds a "Kernel map" section to a trace report:
    what the map predicts for the run and what that means for its fork; for a matrix that ran
    without one, its cells are predicted from their recorded settings and the map is cited.  A
    map file given as ``src`` gets a report of its own.  Returns what was written, by kind
    ("html", "markdown", "card", and one entry per plot).
    """
    from ..kernels.map import KernelMap
    from ..locate.find import Located

    kind, obj = _classify(src)
    _plain_name(name)
    kmap, map_file = _kernel_map(kernel_map, kind)
    out = _folder(out_dir)
    written: dict[str, Path] = {}
    section = None
    if kind in ("trace", "locate"):
        pngs, files, card_ref = _write_pictures(obj, kind, out, name, plots, card, card_path, written)
        if kind == "locate":
            file = None if isinstance(src, Located) else str(src)
            html_text, md_text = locate_html(obj, file, pngs), locate_markdown(obj, file, files)
        else:
            section = trace_kernel_section(obj, kmap, map_file) if kmap is not None else None
            html_text = trace_html(obj, pngs, kernel=section)
            md_text = trace_markdown(obj, files, card=card_ref, kernel=section)
    elif kind == "quality":
        from .outcomes import quality_html, quality_markdown

        html_text, md_text = quality_html(obj), quality_markdown(obj)
    elif kind == "kernels":
        file = None if isinstance(src, KernelMap) else str(src)
        html_text = kernels_html(obj, file)
        md_text = kernels_markdown(obj, file)
    else:
        if kmap is not None:
            obj = cite_in_matrix(obj, kmap, map_file or "the kernel map given")
        fork_trace = earliest_fork_trace(obj, None if isinstance(src, dict) else Path(src))
        html_text = matrix_html(obj, fork_trace)
        md_text = matrix_markdown(obj, fork_trace)
    written["html"] = write_atomic(out / f"{name}.html", html_text)
    written["markdown"] = write_atomic(out / f"{name}.md", md_text)
    if kind == "trace":  # the one self-contained file to attach to an issue: arms linked, plots as SVG
        from .linked import linked_html

        written["linked"] = write_atomic(out / f"{name}-linked.html", linked_html(obj, kernel=section))
    return written
