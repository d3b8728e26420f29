"""The "Run matrix" dialog: a small reproducer matrix around the current controls, or the prompt suite.

Targets are demo quantizations (plus the current target when it is not one),
drafters are the current drafter, ``ngram-simple`` and ``none``, and n_max is 1
and/or the current value.  Prompt, max tokens, engine and engine settings come
from the controls, so the cells answer "which of these settings forks?" for the
run on screen.

"Prompt suite" runs the built-in suite (every category or the chosen ones)
instead of the current prompt, as ``specview matrix --suite`` does: it starts
from the setting on screen (its target, drafter and n_max), and cells stop their
speculative arm :data:`~specview.core.matrix.suite.STOP_AFTER_FORK` tokens after
their fork unless full texts are asked for; the Matrix tab then shows the
divergence rates.  "Task suite" runs the items of a task suite of ``specview
quality`` (the ones scored without running code), as ``specview matrix --suite
NAME --items N``: each cell scores both arms' answers and each setting says how
many changed.  An optional kernel map file is cited as ``--kernel-map``
cites it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ...core.config import RunConfig, field_of, get_setting
from ...core.errors import SpecviewError
from ...core.matrix import MatrixSpec, PromptSpec, expand, model_label
from ...core.matrix.spec import axis_fields, cell_settings
from ...core.matrix.quality import load_items, suite_block, task_prompts
from ...core.matrix.suite import STOP_AFTER_FORK, SUITE_CATEGORIES, suite
from ...core.quality import BUILTIN

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


#: "stop after the fork" unchanged: the cells' own setting (cfg's, or the suite's default)
KEEP = object()


def matrix_spec(cfg: RunConfig, targets: list[str], drafters: list[str], n_max: list[int], *,
                diagnose: bool = True, suite_categories: list[str] | None | bool = False,
                stop_after_fork: int | None | object = KEEP, kernel_map: str | None = None,
                task: dict | None = None) -> MatrixSpec:
    """A matrix over ``targets`` x ``drafters`` x ``n_max`` sharing ``cfg``'s prompt and every other setting.

    The settings a matrix declares (its axes and the settings its cells share) are taken from ``cfg`` by
    the same declarations the matrix is built from, so no setting of the run on screen is dropped.

    ``suite_categories`` other than False runs the prompt suite instead of ``cfg``'s prompt: None (or
    True) every category, else the categories listed, as ``specview matrix --suite [CATEGORIES]``; its
    cells then stop :data:`STOP_AFTER_FORK` tokens after their fork unless ``stop_after_fork`` says
    otherwise (None: full texts).  ``kernel_map`` (a ``specview.kernels/1`` file) is cited as
    ``specview matrix --kernel-map FILE`` cites it: each cell records what the map predicts for it.
    ``task`` (:func:`~specview.core.matrix.quality.suite_block`) runs a task suite's items instead, each cell's
    answers scored, as ``specview matrix --suite NAME --items N``; its cells never stop after the fork.
    """
    if task is not None:
        prompts = task_prompts(load_items(task), chat=cfg.chat)
    elif suite_categories is not False:
        prompts = suite(None if suite_categories in (None, True) else list(suite_categories))
    elif cfg.prompt_tokens:
        prompts = [PromptSpec(name="tokens", tokens=tuple(cfg.prompt_tokens), chat=False)]
    else:
        prompts = [PromptSpec(name="prompt", text=cfg.prompt or "", chat=cfg.chat)]
    kw = {f.name: [get_setting(cfg, f.name)] for f in axis_fields()}
    kw.update({f.name: getattr(cfg, f.name) for f in cell_settings(RunConfig)})
    kw.update(targets=list(targets), drafters=list(drafters), n_max=list(n_max), prompts=prompts,
              backend=cfg.backend, engine=replace(cfg.engine), diagnose=diagnose, kernel_map=kernel_map or None)
    if task is not None:
        kw.update(quality=task, stop_after_fork=None)  # an answer is scored on the whole text
    elif stop_after_fork is not KEEP:
        kw["stop_after_fork"] = stop_after_fork
    elif suite_categories is not False and kw.get("stop_after_fork") is None:
        kw["stop_after_fork"] = STOP_AFTER_FORK
    spec = MatrixSpec(**kw)
    spec.validate()
    return spec


class MatrixDialog(QDialog):
    """Checkboxes for targets, drafters and n_max, the prompt (current or the suite); ``spec()`` is the matrix."""

    def __init__(self, cfg: RunConfig, *, diagnose: bool = True, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Run a reproducer matrix")
        self.setObjectName("matrix_dialog")
        self.cfg = cfg
        self.diagnose = diagnose
        self.boxes: dict[str, list[tuple[object, QCheckBox]]] = {}
        self._quiet = False  # True while the dialog itself sets boxes (they are not the user's choice)
        self._axes_touched = False
        self._stop_touched = False
        lay = QVBoxLayout(self)
        intro = QLabel("Every combination runs both arms on the current prompt (or every prompt of the suite) and "
                       "settings; models load once and each target's vanilla arm runs once per prompt. Esc cancels "
                       "between forward passes.")
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
                c.toggled.connect(self._axis_toggled)
                bl.addWidget(c)
                row.append((value, c))
            self.boxes[axis] = row
            lay.addWidget(box)
        lay.addWidget(self._prompt_box())
        lay.addWidget(self._kernel_map_box())
        self.count = QLabel()
        self.count.setObjectName("matrix_count")
        self.count.setWordWrap(True)
        lay.addWidget(self.count)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Run matrix")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self._prompt_changed()

    def _prompt_box(self) -> QGroupBox:
        box = QGroupBox("Prompts")
        bl = QVBoxLayout(box)
        current = "the current prompt's token ids" if self.cfg.prompt_tokens else "the current prompt"
        self.prompt_current = QRadioButton(current[0].upper() + current[1:])
        self.prompt_current.setObjectName("matrix_prompt_current")
        n_all = len(suite())
        self.prompt_suite = QRadioButton(f"Prompt suite: {n_all} built-in prompts in {len(SUITE_CATEGORIES)} "
                                         "categories, for divergence rates with 95% intervals")
        self.prompt_suite.setObjectName("matrix_prompt_suite")
        self.prompt_group = QButtonGroup(self)
        self.prompt_group.addButton(self.prompt_current)
        self.prompt_group.addButton(self.prompt_suite)
        self.prompt_current.setChecked(True)
        bl.addWidget(self.prompt_current)
        bl.addWidget(self.prompt_suite)
        cats = QGridLayout()  # the prompt suite's categories, under it
        cats.setContentsMargins(24, 0, 0, 0)
        self.category_boxes: list[tuple[str, QCheckBox]] = []
        for i, cat in enumerate(SUITE_CATEGORIES):
            c = QCheckBox(f"{cat} ({len(suite([cat]))})")
            c.setObjectName(f"matrix_suite_{cat}")
            c.setChecked(True)
            c.toggled.connect(self._update)
            cats.addWidget(c, i // 4, i % 4)
            self.category_boxes.append((cat, c))
        bl.addLayout(cats)
        bl.addLayout(self._task_row())
        stop = QHBoxLayout()
        self.stop_box = QCheckBox("Stop each cell's speculative arm")
        self.stop_box.setObjectName("matrix_stop_after_fork")
        self.stop_box.setToolTip("a rate needs only each cell's fork, not its whole text (specview matrix "
                                 "--stop-after-fork N); unchecked: every cell generates its full text (--full-text)")
        self.stop_n = QSpinBox()
        self.stop_n.setObjectName("matrix_stop_n")
        f = field_of(RunConfig, "stop_after_fork")
        self.stop_n.setRange(int(f.metadata.get("min", 0)), 1_000_000)
        self.stop_n.setValue(STOP_AFTER_FORK)
        self.stop_n.setSuffix(" tokens after its fork")
        stop.addWidget(self.stop_box)
        stop.addWidget(self.stop_n)
        stop.addStretch(1)
        bl.addLayout(stop)
        self.prompt_suite.toggled.connect(self._prompt_changed)
        self.stop_box.toggled.connect(self._stop_toggled)
        self.stop_n.valueChanged.connect(self._update)
        return box

    def _task_row(self) -> QHBoxLayout:
        """A task suite (its items the prompts, each cell's answers scored): the suite and how many items."""
        row = QHBoxLayout()
        self.prompt_task = QRadioButton("Task suite, whether the answers change:")
        self.prompt_task.setObjectName("matrix_prompt_task")
        self.prompt_task.setToolTip("each item of a task suite is a prompt; every cell scores both arms' answers and "
                                    "each setting says how many stayed the same and how many changed, with McNemar's "
                                    "exact p (specview matrix --suite NAME --items N)")
        self.prompt_group.addButton(self.prompt_task)
        self.task_suite = QComboBox()
        self.task_suite.setObjectName("matrix_task_suite")
        self.task_suite.addItems([*BUILTIN, "mixed"])  # the suites scored without running code
        self.task_items = QSpinBox()
        self.task_items.setObjectName("matrix_task_items")
        self.task_items.setRange(1, 100_000)
        self.task_items.setValue(20)
        self.task_items.setSuffix(" items")
        for w in (self.prompt_task, self.task_suite, self.task_items):
            row.addWidget(w)
        row.addStretch(1)
        self.prompt_task.toggled.connect(self._prompt_changed)
        self.task_suite.currentIndexChanged.connect(self._update)
        self.task_items.valueChanged.connect(self._update)
        return row

    def task(self) -> dict | None:
        """The task suite chosen (a spec's ``quality`` block), or None."""
        if not self.prompt_task.isChecked():
            return None
        return suite_block(self.task_suite.currentText(), self.task_items.value())

    def _kernel_map_box(self) -> QGroupBox:
        box = QGroupBox("Kernel map (optional)")
        bl = QHBoxLayout(box)
        self.kernel_map = QLineEdit()
        self.kernel_map.setObjectName("matrix_kernel_map")
        self.kernel_map.setPlaceholderText("a kernel map file (specview kernels -o FILE): each cell records what it "
                                           "predicts")
        self.kernel_map.setToolTip("cite a kernel map, as specview matrix --kernel-map FILE: each cell records "
                                   "whether the map proves its setting lossless, and the summary names every "
                                   "contradiction")
        self.kernel_map.setClearButtonEnabled(True)
        self.kernel_map.textChanged.connect(self._update)
        browse = QPushButton("Browse…")
        browse.setObjectName("matrix_kernel_map_browse")
        browse.clicked.connect(self._choose_kernel_map)
        bl.addWidget(self.kernel_map, 1)
        bl.addWidget(browse)
        return box

    def _choose_kernel_map(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Cite a specview kernel map", str(Path.cwd()),
                                              "specview kernel maps (*.json);;All files (*)")
        if path:
            self.kernel_map.setText(path)

    # -- what was chosen ---------------------------------------------------------------
    def chosen(self, axis: str) -> list:
        return [v for v, c in self.boxes[axis] if c.isChecked()]

    def suite_categories(self) -> list[str] | None | bool:
        """False: the current prompt; None: every suite category; else the chosen categories."""
        if not self.prompt_suite.isChecked():
            return False
        cats = [cat for cat, c in self.category_boxes if c.isChecked()]
        return None if len(cats) == len(self.category_boxes) else cats

    def stop_after_fork(self) -> int | None:
        return self.stop_n.value() if self.stop_box.isChecked() else None

    def spec(self) -> MatrixSpec:
        """The matrix the dialog describes; raises SpecviewError naming an empty axis or an empty suite."""
        cats = self.suite_categories()
        if cats == []:
            raise SpecviewError("choose at least one suite category")
        return matrix_spec(self.cfg, self.chosen("targets"), self.chosen("drafters"),
                           [int(n) for n in self.chosen("n_max")], diagnose=self.diagnose, suite_categories=cats,
                           stop_after_fork=self.stop_after_fork(),
                           kernel_map=self.kernel_map.text().strip() or None, task=self.task())

    # -- keeping the choices consistent -------------------------------------------------
    def _axis_toggled(self, *_a) -> None:
        if not self._quiet:
            self._axes_touched = True
        self._update()

    def _stop_toggled(self, *_a) -> None:
        if not self._quiet:
            self._stop_touched = True
        self._update()

    def _prompt_changed(self, *_a) -> None:
        """The suite starts from the setting on screen, as ``--suite`` starts from the demo's, and stops its cells
        after the fork; the current prompt runs them in full (unless the user chose otherwise)."""
        on = self.prompt_suite.isChecked() or self.prompt_task.isChecked()  # many prompts: the setting on screen
        self._quiet = True
        try:
            if not self._axes_touched:
                kinds = [v for v, _c in self.boxes["drafters"]]
                drafter = self.cfg.draft or (self.cfg.spec_type if self.cfg.spec_type in kinds else "none")
                current = {"targets": {self.cfg.target}, "drafters": {drafter}, "n_max": {self.cfg.n_max}}
                defaults = matrix_choices(self.cfg)
                for axis, row in self.boxes.items():
                    on_by_default = dict(defaults[axis])
                    for value, c in row:
                        c.setChecked(value in current[axis] if on else bool(on_by_default.get(value)))
            if not self._stop_touched:
                self.stop_box.setChecked(self.prompt_suite.isChecked() or self.cfg.stop_after_fork is not None)
                if not on and self.cfg.stop_after_fork is not None:
                    self.stop_n.setValue(self.cfg.stop_after_fork)
        finally:
            self._quiet = False
        for _cat, c in self.category_boxes:
            c.setEnabled(self.prompt_suite.isChecked())
        task = self.prompt_task.isChecked()
        self.task_suite.setEnabled(task)
        self.task_items.setEnabled(task)
        self.stop_box.setEnabled(not task)  # an answer is scored on the whole text
        self._update()

    def _update(self, *_a) -> None:
        self.stop_n.setEnabled(self.stop_box.isChecked() and self.stop_box.isEnabled())
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        try:
            spec = self.spec()
            n = len(expand(spec))
        except SpecviewError as exc:
            self.count.setText(str(exc))
            ok.setEnabled(False)
            return
        text = f"{n} cell{'s' if n != 1 else ''}"
        if len(spec.prompts) > 1:
            k = n // len(spec.prompts)
            text += (f" ({len(spec.prompts)} prompts × {k} setting{'s' if k != 1 else ''}), "
                     f"{spec.max_tokens} tokens per arm")
        if spec.stop_after_fork is not None:
            text += f"; cells stop {spec.stop_after_fork} tokens after their fork"
        if len(spec.prompts) > 1:
            text += ("; forks diagnosed (their gaps fill the severity histogram)" if spec.diagnose else
                     "; forks not diagnosed, so no gaps (tick 'diagnose the fork' for the severity histogram)")
        self.count.setText(text)
        ok.setEnabled(n > 0)
        if self.isVisible():  # a longer count line wraps: the dialog grows rather than squeezing its boxes
            self._fit()

    def _fit(self) -> None:
        self.resize(self.size().expandedTo(self.sizeHint()))

    def showEvent(self, ev) -> None:  # noqa: N802 - Qt name
        """Shown at the size its boxes need: a top-level window can open at its minimum, which squeezes the
        suite's category boxes to half their height."""
        super().showEvent(ev)
        self._fit()
