"""Asking before model-written code runs: what will run, and what the sandbox enforces on this machine.

A code suite (HumanEval, a JSONL file with tests) is scored by running each
arm's completion with the item's test.  Nothing runs before the user says yes
(``specview quality --execute`` is the CLI's yes); the dialog says how many
programs, what each is made of, and the sandbox's own account of what it
enforces here (:func:`specview.core.quality.execute.sandbox_report`, with what
it cannot enforce on this platform), or the limits it is given where its probe
did not run.  No (or Esc) runs
nothing.

Where this machine lacks a fence docs/quality-sandbox.md promises
(:meth:`SandboxReport.missing`), the dialog names each one and its Yes stays
disabled until "run without these fences" is ticked: the app's
``--allow-weak-sandbox``.  :func:`checked_sandbox` is the refusal itself,
:func:`specview.core.quality.execute.sandbox_record`'s, worded for the app.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QMessageBox, QWidget

#: the app's words for ``--allow-weak-sandbox``: the confirmation's checkbox
ALLOW_WEAK = "Run it anyway, without these fences (--allow-weak-sandbox)"


def sandbox_lines() -> list[str]:
    """What the sandbox enforces, a line each: its report on this platform, else the limits every sample gets."""
    from ...core.errors import SpecviewError
    from ...core.quality import execute

    report = getattr(execute, "sandbox_report", None)
    if report is not None:
        try:
            r = report()  # a probe sample, once per process: what held around it on this platform
            lines = [*r.lines(), *(f"NOT enforced here: {g}" for g in r.gaps())]
            if any(x.strip() for x in lines):
                return [x for x in lines if x.strip()]
        except (SpecviewError, OSError):
            pass
    lim = execute.Limits()
    return [
        "each sample runs in a fresh Python process (no site-packages, none of your environment variables: no tokens, "
        "no keys), in its own new temporary folder (its working folder, HOME and TMPDIR), removed afterwards",
        f"wall clock {lim.wall_s:g} s and CPU {lim.cpu_s:g} s, then the whole process group is killed",
        f"memory {lim.memory_mb} MB; files up to {lim.file_mb} MB, {lim.disk_mb} MB in all",
        "no new processes or threads" if lim.processes == 0 else f"at most {lim.processes} processes",
        "no network and no other process's signals where the platform gives namespaces (Linux); writes outside its "
        "folder refused where it gives Landlock",
    ]


def probe() -> Any:
    """This machine's :class:`~specview.core.quality.execute.SandboxReport`, or the SandboxError saying why its
    probe did not run (nothing runs then)."""
    from ...core.quality.execute import SandboxError, sandbox_report

    try:
        return sandbox_report()
    except (SandboxError, OSError) as exc:
        return exc if isinstance(exc, SandboxError) else SandboxError(f"the sandbox's probe could not start ({exc})")


def checked_sandbox(allow_weak: bool) -> dict[str, Any]:
    """The record a run of model-written code keeps (``SandboxReport.to_dict``, with ``allowed_weak``), or the
    SandboxError of :func:`~specview.core.quality.execute.refuse_weak` with what the app's confirmation offers."""
    from ...core.quality.execute import SandboxError, sandbox_record

    try:
        return sandbox_record(allow_weak)
    except SandboxError as exc:
        raise SandboxError(f"{exc}. In the app: tick \"{ALLOW_WEAK}\" in the confirmation") from None


class ExecuteConfirm(QMessageBox):
    """Yes / No before a suite's model-written code runs; No is the default.

    ``missing`` are the promised fences this machine lacks (from the probe); with any, the dialog lists them and
    Yes is enabled only once the checkbox (:data:`ALLOW_WEAK`) is ticked; :attr:`allow_weak` is its answer.
    """

    def __init__(self, suite: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("quality_execute_confirm")
        self.setIcon(QMessageBox.Icon.Warning)
        self.setWindowTitle("Run model-written code?")
        code = [it for it in suite.items if it.kind == "code"]
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setText(f"<b>Scoring {html.escape(suite.name)} runs Python code the model wrote.</b>")
        self.lines = sandbox_lines()
        report = probe()
        self.missing: list[str] = [] if isinstance(report, Exception) else report.missing()
        self.setInformativeText(
            f"{len(code)} code item{'s' if len(code) != 1 else ''} × 2 arms: up to {2 * len(code)} programs, each the "
            "item's prompt, one arm's completion and the item's test (<code>check(candidate)</code>), run one at a "
            "time in the sandbox (<code>specview quality --execute</code> does the same).<br><br>"
            "<b>The sandbox enforces:</b><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in self.lines) + "</ul>"
            + self._missing_text() + "No runs nothing.")
        self.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No)
        self.setDefaultButton(QMessageBox.StandardButton.No)
        self.setEscapeButton(QMessageBox.StandardButton.No)
        yes = self.button(QMessageBox.StandardButton.Yes)
        yes.setText("Run the code")
        self.weak: QCheckBox | None = None
        if self.missing:
            self.weak = QCheckBox(ALLOW_WEAK)
            self.weak.setObjectName("quality_allow_weak_sandbox")
            self.setCheckBox(self.weak)
            yes.setEnabled(False)
            self.weak.toggled.connect(yes.setEnabled)

    def _missing_text(self) -> str:
        if not self.missing:
            return ""
        return ("<b>This machine's sandbox lacks what docs/quality-sandbox.md promises for model-written code:</b>"
                "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in self.missing) + "</ul>"
                "The code runs only if you tick the box below, knowing it is not fenced that way.<br><br>")

    @property
    def allow_weak(self) -> bool:
        """Whether the user said to run without the missing fences (the checkbox ticked)."""
        return self.weak is not None and self.weak.isChecked()

    def confirmed(self) -> bool:
        """Show the dialog; True only for Yes."""
        return self.exec() == QMessageBox.StandardButton.Yes


__all__ = ["ALLOW_WEAK", "ExecuteConfirm", "checked_sandbox", "probe", "sandbox_lines"]
