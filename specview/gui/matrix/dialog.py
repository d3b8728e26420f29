"""The "Run matrix" dialog: a small reproducer matrix around the current controls.

Targets are demo quantizations (plus the current target when it is not one),
drafters are the current drafter, ``ngram-simple`` and ``none``, and n_max is 1
and/or the current value.  Prompt, max tokens, engine and engine settings come
from the controls, so the cells answer "which of these settings forks?" for the
run on screen.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QGroupBox,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from ...core.config import RunConfig, get_setting
from ...core.errors import SpecviewError
from ...core.matrix import MatrixSpec, PromptSpec, expand, model_label
from ...core.matrix.spec import axis_fields, cell_settings

DEMO_TARGETS = ("demo:F16", "demo:Q8_0", "demo:Q4_K_M")


def matrix_choices(cfg: RunConfig) -> dict[str, list[tuple[object, bool]]]:
    """(value, checked by default) per axis for a matrix around ``cfg``."""
    targets = [(t, t == cfg.target or t in ("demo:Q8_0", "demo:Q4_K_M")) for t in DEMO_TARGETS]
    if cfg.target not in DEMO_TARGETS:
        targets.insert(0, (cfg.target, True))
    drafters: list[tuple[object, bool]] = []
    if cfg.draft:
        drafters.append((cfg.draft, True))
    drafters += [("ngram-simple", True), ("none", True)]
    n_max = [(1, True)]
    if cfg.n_max != 1:
        n_max.append((cfg.n_max, True))
    return {"targets": targets, "drafters": drafters, "n_max": n_max}


def matrix_spec(cfg: RunConfig, targets: list[str], drafters: list[str], n_max: list[int], *,
                diagnose: bool = True) -> MatrixSpec:
    """A matrix over ``targets`` x ``drafters`` x ``n_max`` sharing ``cfg``'s prompt and every other setting.

    The settings a matrix declares (its axes and the settings its cells share) are taken from ``cfg`` by
    the same declarations the matrix is built from, so no setting of the run on screen is dropped.
    """
    if cfg.prompt_tokens:
        prompt = PromptSpec(name="tokens", tokens=tuple(cfg.prompt_tokens), chat=False)
    else:
        prompt = PromptSpec(name="prompt", text=cfg.prompt or "", chat=cfg.chat)
    kw = {f.name: [get_setting(cfg, f.name)] for f in axis_fields()}
    kw.update({f.name: getattr(cfg, f.name) for f in cell_settings(RunConfig)})
    kw.update(targets=list(targets), drafters=list(drafters), n_max=list(n_max), prompts=[prompt],
              backend=cfg.backend, engine=replace(cfg.engine), diagnose=diagnose)
    spec = MatrixSpec(**kw)
    spec.validate()
    return spec


class MatrixDialog(QDialog):
    """Checkboxes for targets, drafters and n_max; ``spec()`` is the matrix they describe."""

    def __init__(self, cfg: RunConfig, *, diagnose: bool = True, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Run a reproducer matrix")
        self.setObjectName("matrix_dialog")
        self.cfg = cfg
        self.diagnose = diagnose
        self.boxes: dict[str, list[tuple[object, QCheckBox]]] = {}
        lay = QVBoxLayout(self)
        intro = QLabel("Every combination runs both arms on the current prompt and settings; models load once "
                       "and each target's vanilla arm runs once. Esc cancels between forward passes.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        titles = {"targets": "Targets", "drafters": "Drafters", "n_max": "n_max (draft model only)"}
        for axis, values in matrix_choices(cfg).items():
            box = QGroupBox(titles[axis])
            bl = QVBoxLayout(box)
            row = []
            for value, on in values:
                text = str(value) if axis == "n_max" else model_label(str(value))
                if axis != "n_max" and text != str(value):
                    text = f"{text}  ({value})"
                c = QCheckBox(text)
                c.setObjectName(f"matrix_{axis}_{value}")
                c.setChecked(on)
                c.toggled.connect(self._update)
                bl.addWidget(c)
                row.append((value, c))
            self.boxes[axis] = row
            lay.addWidget(box)
        self.count = QLabel()
        self.count.setObjectName("matrix_count")
        lay.addWidget(self.count)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Run matrix")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self._update()

    def chosen(self, axis: str) -> list:
        return [v for v, c in self.boxes[axis] if c.isChecked()]

    def spec(self) -> MatrixSpec:
        """The matrix the checkboxes describe; raises SpecviewError naming an empty axis."""
        return matrix_spec(self.cfg, self.chosen("targets"), self.chosen("drafters"),
                           [int(n) for n in self.chosen("n_max")], diagnose=self.diagnose)

    def _update(self, *_a) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        try:
            n = len(expand(self.spec()))
        except SpecviewError as exc:
            self.count.setText(str(exc))
            ok.setEnabled(False)
            return
        self.count.setText(f"{n} cell{'s' if n != 1 else ''}")
        ok.setEnabled(n > 0)
