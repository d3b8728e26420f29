"""The main window: controls, the two panes, the two plots and the verdict bar.

The window is a controller: it builds a :class:`RunConfig` from the controls,
submits it to the model worker, buffers the streamed events and renders them
at most about 30 times a second, and shows finished (or opened) traces.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QColor, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QStyle,
    QStyleFactory,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..core.engine import BackendUnavailable, EngineSettings, SpecviewError
from ..core.session import RunConfig
from ..core.trace import Round, Step, Trace
from . import models as gmodels
from .matrix_view import MatrixView
from .panes import MISMATCH_HUE, PaintClock, PanePair, blend, is_dark
from .plots import AcceptancePlot, MarginPlot
from .worker import (
    ArmStarted,
    Derived,
    DeriveRequest,
    MatrixCell,
    MatrixFinished,
    MatrixRequest,
    Progress,
    PreloadRequest,
    RoundEvent,
    RunFailed,
    RunFinished,
    RunRequest,
    RunStarted,
    StepEvent,
    WorkerHost,
    diagnose_function,
)

FRAME_MS = 33  # streaming redraws: about 30 a second when drawing is cheap
DRAW_SHARE = 0.08  # at most this share of wall time goes to drawing while a run streams
MAX_FRAME_MS = 1000
AUTO_RUN_MS = 450  # debounce for flip-and-see
AUTO_RUN_PROMPT_MS = 1200  # longer while typing a prompt
OK_HUE = QColor(40, 160, 70)
WARN_HUE = QColor(230, 150, 30)
ENGINES = ("llama.cpp", "mlx", "llama-server")  # in-process llama.cpp and MLX, and the user's own server
SPEC_TYPES = ("draft-simple", "ngram-simple", "none")  # the in-process engines' drafters

DEFAULTS: dict[str, Any] = {
    "engine": "llama.cpp",
    "server_bin": "",
    "server_args": "",
    "target": "demo:Q8_0",
    "draft": "demo:Q4_0",
    "spec_type": "draft-simple",
    "n_max": 3,
    "n_min": 0,
    "p_min": 0.0,
    "max_tokens": 256,
    "ignore_eos": False,
    "flash_attn": "auto",
    "gpu_layers": -1,
    "n_ctx": 0,
    "threads": 0,
    "chat": True,
    "prompt": "Write an essay on the importance of sleep for students.",
    "diagnose": True,
    "auto_run": True,
    "boundaries": False,
    "theme": "system",
    "recent": [],
}


def prompts_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "resources" / "prompts"


def builtin_prompts() -> dict[str, str]:
    """Name -> text of the prompts shipped in ``specview/resources/prompts``."""
    out: dict[str, str] = {}
    d = prompts_dir()
    if d.is_dir():
        for f in sorted(d.glob("*.txt")):
            try:
                out[f.stem] = f.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                continue
    return out


def default_settings_path() -> Path:
    env = os.environ.get("SPECVIEW_CONFIG_DIR")
    if env:
        return Path(env).expanduser() / "gui.json"
    from platformdirs import user_config_dir

    return Path(user_config_dir("specview", appauthor=False)) / "gui.json"


def fmt_margin(x: float | None) -> str:
    """A margin as the app shows it; "n/a" where the engine reported none (llama-server)."""
    if x is None:
        return "n/a"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return f"{v:.4f}" if math.isfinite(v) else "n/a"


def is_matrix_file(path: str | os.PathLike[str]) -> bool:
    """True for a ``specview.matrix/...`` JSON file (its schema key comes first), read from its first bytes only."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return b'"specview.matrix/' in head


def engine_problem(name: str, server_bin: str | None = None) -> str | None:
    """Why the engine ``name`` cannot run here (its BackendUnavailable reason), or None when it can."""
    from ..core.registry import get_backend

    if name == "llama-server":
        from ..backends.server import find_server_bin, server_spec_types

        try:
            server_spec_types(find_server_bin(server_bin or None))
        except SpecviewError as exc:
            return str(exc)
        return None
    try:
        get_backend(name)
    except BackendUnavailable as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a broken installation: still a reason, never a traceback
        return f"{type(exc).__name__}: {exc}"
    return None


def mismatch_positions(a: list[int], b: list[int]) -> list[int]:
    """Indices where the arms' tokens differ, aligned by index; a length difference counts once, at its start."""
    n = min(len(a), len(b))
    out = [i for i in range(n) if a[i] != b[i]]
    if len(a) != len(b):
        out.append(n)
    return out


def dark_palette() -> QPalette:
    p = QPalette()
    C = QPalette.ColorRole
    window, base, text = QColor(37, 39, 43), QColor(27, 29, 32), QColor(222, 224, 228)
    p.setColor(C.Window, window)
    p.setColor(C.WindowText, text)
    p.setColor(C.Base, base)
    p.setColor(C.AlternateBase, QColor(45, 47, 52))
    p.setColor(C.ToolTipBase, QColor(50, 52, 58))
    p.setColor(C.ToolTipText, text)
    p.setColor(C.PlaceholderText, QColor(140, 142, 148))
    p.setColor(C.Text, text)
    p.setColor(C.Button, QColor(50, 52, 58))
    p.setColor(C.ButtonText, text)
    p.setColor(C.BrightText, QColor(255, 90, 90))
    p.setColor(C.Link, QColor(110, 170, 255))
    p.setColor(C.Highlight, QColor(60, 120, 215))
    p.setColor(C.HighlightedText, QColor(255, 255, 255))
    for role in (C.Text, C.ButtonText, C.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(120, 122, 128))
    return p


def light_palette() -> QPalette:
    p = QPalette()
    C = QPalette.ColorRole
    p.setColor(C.Window, QColor(239, 240, 242))
    p.setColor(C.WindowText, QColor(20, 22, 25))
    p.setColor(C.Base, QColor(255, 255, 255))
    p.setColor(C.AlternateBase, QColor(245, 246, 248))
    p.setColor(C.ToolTipBase, QColor(255, 255, 235))
    p.setColor(C.ToolTipText, QColor(20, 22, 25))
    p.setColor(C.Text, QColor(20, 22, 25))
    p.setColor(C.Button, QColor(232, 233, 236))
    p.setColor(C.ButtonText, QColor(20, 22, 25))
    p.setColor(C.Highlight, QColor(48, 110, 210))
    p.setColor(C.HighlightedText, QColor(255, 255, 255))
    p.setColor(C.Link, QColor(30, 90, 200))
    return p


class ModelPicker(QWidget):
    """A model name or GGUF path, with a browse button and, for a folder of quantizations, a list to flip through."""

    sigChanged = Signal(str)
    sigDeriveWanted = Signal(object)  # models.QuantChoice

    def __init__(self, role: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.combo = QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setObjectName(f"{role}_model")
        self.combo.setMinimumContentsLength(14)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        for name in gmodels.DEMO_CHOICES:
            self.combo.addItem(name)
        self.combo.setToolTip("a demo quantization (derived on first use) or the path of a GGUF file")
        self.browse = QToolButton()
        self.browse.setText("…")
        self.browse.setToolTip(f"choose a GGUF file for the {role}")
        self.browse.clicked.connect(self._browse)
        self.browse.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
        self.folder = QToolButton()
        self.folder.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DirOpenIcon))
        self.folder.setToolTip("choose a folder holding several quantizations of one model")
        self.folder.clicked.connect(self._browse_folder)
        self.quants = QComboBox()
        self.quants.setObjectName(f"{role}_quants")
        self.quants.setToolTip("quantizations of this model in its folder; entries marked 'derive' are made "
                               "with llama.cpp's quantizer from the higher-precision file")
        self.quants.setVisible(False)
        self.quants.activated.connect(self._quant_chosen)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.setSpacing(2)
        top.addWidget(self.combo, 1)
        top.addWidget(self.browse)
        top.addWidget(self.folder)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.quants)
        self.combo.activated.connect(lambda _i: self._commit())
        self.combo.lineEdit().editingFinished.connect(self._commit)
        self._last = ""
        self.choices: list[gmodels.QuantChoice] = []
        self.engine = "llama.cpp"

    def set_engine(self, engine: str) -> None:
        """llama.cpp takes GGUF files; mlx takes MLX model folders (the browse button picks a folder)."""
        self.engine = engine
        mlx = engine == "mlx"
        self.folder.setVisible(not mlx)
        if mlx:
            self.browse.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DirOpenIcon))
            self.browse.setToolTip(f"choose the MLX model folder of the {self.role} (written by mlx_lm.convert)")
            self.combo.setToolTip("a demo quantization or the path of an MLX model folder")
        else:
            self.browse.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
            self.browse.setToolTip(f"choose a GGUF file for the {self.role}")
            self.combo.setToolTip("a demo quantization (derived on first use) or the path of a GGUF file")
        self._refresh_quants(self.value())

    def value(self) -> str:
        return self.combo.currentText().strip()

    def set_value(self, name: str, *, emit: bool = False) -> None:
        with QSignalBlocker(self.combo):
            i = self.combo.findText(name)
            if i < 0:
                self.combo.addItem(name)
                i = self.combo.count() - 1
            self.combo.setCurrentIndex(i)
        self._refresh_quants(name)
        if emit:
            self._commit()
        else:
            self._last = name

    def _commit(self) -> None:
        v = self.value()
        if v == self._last:
            return
        self._last = v
        self._refresh_quants(v)
        self.sigChanged.emit(v)

    def _refresh_quants(self, name: str) -> None:
        self.choices = []
        if self.engine == "llama.cpp" and name and not name.lower().startswith("demo") \
                and Path(name).expanduser().exists():
            self.choices = gmodels.siblings(name)
        elif self.engine == "mlx" and name and Path(name).expanduser().is_dir():
            self.choices = gmodels.mlx_siblings(name)
        show = len(self.choices) > 1
        self.quants.setVisible(show)
        with QSignalBlocker(self.quants):
            self.quants.clear()
            for c in self.choices:
                self.quants.addItem(c.label)
            cur = {str(Path(name).expanduser()), str(Path(name).expanduser().resolve())}
            for i, c in enumerate(self.choices):
                if c.exists and c.path in cur:
                    self.quants.setCurrentIndex(i)

    def _quant_chosen(self, i: int) -> None:
        if not 0 <= i < len(self.choices):
            return
        c = self.choices[i]
        if c.exists:
            self.set_value(c.path, emit=True)
        else:
            self.sigDeriveWanted.emit(c)

    def _browse(self) -> None:
        start = self.value() if Path(self.value()).expanduser().exists() else str(Path.home())
        if self.engine == "mlx":
            folder = QFileDialog.getExistingDirectory(self, f"MLX model folder of the {self.role}", start)
            if folder:
                self.set_value(folder, emit=True)
            return
        path, _ = QFileDialog.getOpenFileName(self, f"Choose the {self.role} model", start,
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.set_value(path, emit=True)

    def _browse_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Folder with quantizations of the {self.role} model",
                                                  str(Path.home()))
        if not folder:
            return
        choices = [c for c in gmodels.siblings(folder) if c.exists]
        if choices:
            self.set_value(choices[0].path, emit=True)


@dataclass
class Live:
    """What a streaming run has produced so far (GUI thread only)."""

    request: RunRequest | None = None
    steps: dict[str, list[Step]] = field(default_factory=lambda: {"vanilla": [], "speculative": []})
    pending: dict[str, list[Step]] = field(default_factory=lambda: {"vanilla": [], "speculative": []})
    margins: dict[str, list[float]] = field(default_factory=lambda: {"vanilla": [], "speculative": []})
    rounds: list[Round] = field(default_factory=list)
    first_diff: int | None = None
    dirty: bool = False
    started: float = 0.0


class MainWindow(QMainWindow):
    """specview's desktop window."""

    sigTraceShown = Signal(object)  # Trace, after it is fully displayed (live run or opened file)
    sigError = Signal(str)  # a message shown to the user
    sigBusy = Signal(bool)
    sigMatrixCell = Signal(object)  # a streamed matrix cell record, after the matrix tab shows it
    sigMatrixFinished = Signal(object)  # MatrixFinished, after the matrix tab shows the whole matrix
    sigReportWritten = Signal(object)  # {"html": Path, "markdown": Path, ...}

    def __init__(self, *, settings_path: str | os.PathLike[str] | None = None, preload: bool = False,
                 worker_host: WorkerHost | None = None):
        super().__init__()
        self.setWindowTitle("specview — speculative vs vanilla greedy")
        self.settings_path = Path(settings_path) if settings_path else None
        self.settings = dict(DEFAULTS)
        self.settings.update(self._read_settings())
        self.prompts = builtin_prompts()
        self.host = worker_host or WorkerHost(parent=self)
        self.trace: Trace | None = None
        self.live = Live()
        self.request: RunRequest | None = None
        self.busy = False
        self.last_finished: RunFinished | None = None
        self.last_error: str | None = None
        self._derive: DeriveRequest | None = None
        self._derive_role: str | None = None
        self._preload: PreloadRequest | None = None
        self.matrix_request: MatrixRequest | None = None
        self.engine_problem: str | None = None
        self._suspend_auto = True
        self.diffs: list[int] = []
        self.verdict_kind = "info"
        self._paint_mark = 0.0
        self.frames = 0  # streaming frames drawn (the benchmark reports the rate)

        self._build_ui()
        self._build_actions()
        self._connect_worker()
        self._apply_settings_to_controls()
        self.apply_theme(self.settings.get("theme", "system"))
        self._restore_geometry()

        self.frame_timer = QTimer(self)
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.timeout.connect(self.flush)
        self.auto_timer = QTimer(self)
        self.auto_timer.setSingleShot(True)
        self.auto_timer.timeout.connect(self._auto_run)
        self._suspend_auto = False
        self._set_verdict("Ready. Press Run (Ctrl+R / F5) to run both arms; Esc cancels.", "info")
        if self.engine.currentText() != "llama.cpp":
            self._check_engine()
        if preload:
            try:
                self._preload = self.host.preload(PreloadRequest(self.build_config()))
                self._set_busy(True, "loading the models…")
            except SpecviewError:
                pass

    # ------------------------------------------------------------------ UI
    def _build_ui(self) -> None:
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(6, 6, 6, 4)
        lay.setSpacing(4)
        self.verdict = QLabel()
        self.verdict.setObjectName("verdict")
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setWordWrap(True)
        self.verdict.setMargin(6)
        self.verdict.setAutoFillBackground(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.speed = QLabel()
        self.speed.setObjectName("speed")
        self.speed.setTextFormat(Qt.TextFormat.RichText)
        self.speed.setMargin(2)
        # long model paths must wrap, never widen the window past the screen
        self.speed.setWordWrap(True)
        self.speed.setMinimumWidth(1)
        lay.addWidget(self.verdict)
        lay.addWidget(self.speed)
        self.panes = PanePair()
        self.acceptance = AcceptancePlot()
        self.margin_plot = MarginPlot()
        plots = QSplitter(Qt.Orientation.Horizontal)
        plots.addWidget(self.acceptance)
        plots.addWidget(self.margin_plot)
        plots.setStretchFactor(0, 2)
        plots.setStretchFactor(1, 3)
        self.vsplit = QSplitter(Qt.Orientation.Vertical)
        self.vsplit.addWidget(self.panes)
        self.vsplit.addWidget(plots)
        self.vsplit.setStretchFactor(0, 3)
        self.vsplit.setStretchFactor(1, 2)
        self.matrix_view = MatrixView()
        self.matrix_view.sigOpenRun.connect(self._open_cell)
        # the grid fills the tab, and every row has room for a cell's three lines
        grid_header = self.matrix_view.table.horizontalHeader()
        grid_header.setMinimumSectionSize(130)
        grid_header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.matrix_view.table.verticalHeader().setMinimumSectionSize(
            self.matrix_view.table.fontMetrics().lineSpacing() * 3 + 12)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("tabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.vsplit, "Side by side")
        self.tabs.addTab(self.matrix_view, "Matrix")
        self.tabs.setTabToolTip(1, "a reproducer matrix: which targets, drafters and n_max fork; double-click a "
                                   "cell to open it side by side")
        lay.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self.panes.sigTokenSelected.connect(self._token_selected)
        self.margin_plot.sigIndexClicked.connect(lambda i: self.select_token(i, scroll=True))
        self.acceptance.sigIndexClicked.connect(lambda i: self.select_token(i, scroll=True))

        # -- controls dock
        dock = QDockWidget("Run", self)
        dock.setObjectName("controls_dock")
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        panel = QWidget()
        form_lay = QVBoxLayout(panel)
        form_lay.setContentsMargins(6, 6, 6, 6)

        models_box = QGroupBox("Models")
        mf = QFormLayout(models_box)
        self.engine = QComboBox()
        self.engine.setObjectName("engine")
        self.engine.addItems(list(ENGINES))
        self.engine.setToolTip("--engine: llama.cpp in-process (GGUF files) or mlx-lm (MLX model folders; "
                               "Apple silicon, or mlx[cpu] on Linux)")
        self.engine.currentIndexChanged.connect(self._engine_changed)
        mf.addRow("Engine", self.engine)
        self.server_bin = QLineEdit()
        self.server_bin.setObjectName("server_bin")
        self.server_bin.setPlaceholderText("llama-server on PATH")
        self.server_bin.setToolTip("--server-bin: your llama-server binary (empty: $SPECVIEW_LLAMA_SERVER, "
                                   "PATH, or the copy scripts/build-llama-server.sh builds)")
        self.server_bin.editingFinished.connect(self._engine_changed)
        self.server_args = QLineEdit()
        self.server_args.setObjectName("server_args")
        self.server_args.setPlaceholderText("e.g. -ngl 99 -fa on")
        self.server_args.setToolTip("--server-args: extra llama-server flags, passed through verbatim")
        self.server_args.editingFinished.connect(self._control_changed)
        mf.addRow("Server binary", self.server_bin)
        mf.addRow("Server flags", self.server_args)
        self._server_rows = [self.server_bin, self.server_args]
        self.target = ModelPicker("target")
        self.target.sigChanged.connect(self._control_changed)
        self.target.sigDeriveWanted.connect(lambda c: self.derive(c, "target"))
        mf.addRow("Target", self.target)
        self.spec_type = QComboBox()
        self.spec_type.setObjectName("spec_type")
        self.spec_type.addItem("draft model (draft-simple)", "draft-simple")
        self.spec_type.addItem("n-gram (ngram-simple)", "ngram-simple")
        self.spec_type.addItem("none (verify one token per round)", "none")
        self.spec_type.currentIndexChanged.connect(self._spec_type_changed)
        mf.addRow("Drafter", self.spec_type)
        self.draft = ModelPicker("draft")
        self.draft.sigChanged.connect(self._control_changed)
        self.draft.sigDeriveWanted.connect(lambda c: self.derive(c, "draft"))
        mf.addRow("Draft model", self.draft)
        form_lay.addWidget(models_box)

        spec_box = QGroupBox("Speculation (llama.cpp names)")
        sf = QFormLayout(spec_box)
        self.n_max = self._spin(0, 64, "--spec-draft-n-max: most tokens drafted per round", "n_max")
        self.n_min = self._spin(0, 64, "--spec-draft-n-min: a shorter draft is dropped", "n_min")
        self.p_min = QDoubleSpinBox()
        self.p_min.setObjectName("p_min")
        self.p_min.setRange(0.0, 1.0)
        self.p_min.setDecimals(3)
        self.p_min.setSingleStep(0.05)
        self.p_min.setToolTip("--spec-draft-p-min: stop drafting when the drafter's top token (softmax over its "
                              "top 10) is below this; 1 drafts nothing: the zero-draft control")
        self.p_min.valueChanged.connect(self._control_changed)
        sf.addRow("n_max", self.n_max)
        sf.addRow("n_min", self.n_min)
        sf.addRow("p_min", self.p_min)
        form_lay.addWidget(spec_box)

        gen_box = QGroupBox("Generation and engine")
        gf = QFormLayout(gen_box)
        self.max_tokens = self._spin(1, 100000, "--max-tokens: tokens to generate per arm", "max_tokens")
        self.ignore_eos = self._check("ignore EOS", "--ignore-eos: keep generating past end-of-generation tokens",
                                      "ignore_eos")
        self.chat = self._check("chat template", "wrap the prompt as one user turn with the model's chat template",
                                "chat")
        self.flash_attn = QComboBox()
        self.flash_attn.setObjectName("flash_attn")
        self.flash_attn.addItems(["auto", "on", "off"])
        self.flash_attn.setToolTip("-fa / --flash-attn")
        self.flash_attn.currentIndexChanged.connect(self._control_changed)
        self.gpu_layers = self._spin(-1, 999, "-ngl / --gpu-layers: layers offloaded to the GPU (-1 = all)",
                                     "gpu_layers")
        self.gpu_layers.setSpecialValueText("all")
        self.n_ctx = self._spin(0, 1 << 20, "-c / --ctx-size: 0 sizes the context to the run", "n_ctx")
        self.n_ctx.setSpecialValueText("auto")
        self.threads = self._spin(0, 512, "-t / --threads: 0 = every core ($SPECVIEW_THREADS if set)", "threads")
        self.threads.setSpecialValueText("auto")
        gf.addRow("Max tokens", self.max_tokens)
        gf.addRow("", self.ignore_eos)
        gf.addRow("", self.chat)
        gf.addRow("Flash attention", self.flash_attn)
        gf.addRow("GPU layers", self.gpu_layers)
        gf.addRow("Context", self.n_ctx)
        gf.addRow("Threads", self.threads)
        form_lay.addWidget(gen_box)

        prompt_box = QGroupBox("Prompt")
        pl = QVBoxLayout(prompt_box)
        self.prompt_choice = QComboBox()
        self.prompt_choice.setObjectName("prompt_choice")
        self.prompt_choice.addItem("(custom)", None)
        for name, text in self.prompts.items():
            self.prompt_choice.addItem(name, text)
        self.prompt_choice.activated.connect(self._prompt_chosen)
        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("prompt")
        self.prompt.setMinimumHeight(70)
        self.prompt.setMaximumHeight(150)
        self.prompt.textChanged.connect(self._prompt_edited)
        pl.addWidget(self.prompt_choice)
        pl.addWidget(self.prompt)
        form_lay.addWidget(prompt_box)

        run_box = QGroupBox("Run")
        rl = QVBoxLayout(run_box)
        self.auto_run = self._check("re-run when a setting changes", "flip a control and see: runs again after a short "
                                    "pause, re-running only the arms the change invalidates", "auto_run", rerun=False)
        self.diagnose = self._check("diagnose the fork", "after each run, replay the fork to tell a near-tie from a "
                                    "state bug (needs specview.core.diagnose)", "diagnose")
        if diagnose_function() is None:
            self.diagnose.setToolTip(self.diagnose.toolTip() + " — not available in this installation")
        rl.addWidget(self.auto_run)
        rl.addWidget(self.diagnose)
        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("run_button")
        self.run_button.setToolTip("run both arms (Ctrl+R, F5)")
        self.run_button.clicked.connect(lambda _checked=False: self.run())
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancel_button")
        self.cancel_button.setToolTip("stop the run within one forward pass (Esc)")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        rl.addLayout(buttons)
        form_lay.addWidget(run_box)
        form_lay.addStretch(1)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(panel)
        scroll.setMinimumWidth(panel.sizeHint().width() + 24)
        dock.setWidget(scroll)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
        self.controls_dock = dock

        # -- status bar
        self.status_label = QLabel()
        self.counters = QLabel()
        self.counters.setObjectName("counters")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.counters)
        self.statusBar().addPermanentWidget(self.progress)

    def _spin(self, lo: int, hi: int, tip: str, name: str) -> QSpinBox:
        s = QSpinBox()
        s.setObjectName(name)
        s.setRange(lo, hi)
        s.setToolTip(tip)
        s.setKeyboardTracking(False)
        s.valueChanged.connect(self._control_changed)
        return s

    def _check(self, text: str, tip: str, name: str, *, rerun: bool = True) -> QCheckBox:
        c = QCheckBox(text)
        c.setObjectName(name)
        c.setToolTip(tip)
        if rerun:
            c.toggled.connect(self._control_changed)
        return c

    def _build_actions(self) -> None:
        mb = self.menuBar()
        m_file = mb.addMenu("&File")
        self.act_open = QAction("&Open trace…", self, shortcut=QKeySequence.StandardKey.Open,
                                triggered=self._open_dialog)
        self.act_save = QAction("&Save trace…", self, shortcut=QKeySequence.StandardKey.Save,
                                triggered=self._save_dialog)
        self.act_save.setEnabled(False)
        self.act_open_matrix = QAction("Open &Matrix…", self, shortcut=QKeySequence("Ctrl+Shift+O"),
                                       triggered=self._open_matrix_dialog)
        self.act_export = QAction("&Export Report…", self, shortcut=QKeySequence("Ctrl+E"),
                                  triggered=self._export_dialog)
        self.act_export.setToolTip("write the HTML and Markdown report of the trace on screen into a folder")
        self.act_export.setEnabled(False)
        act_quit = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit, triggered=self.close)
        m_file.addActions([self.act_open, self.act_save, self.act_open_matrix])
        m_file.addSeparator()
        m_file.addAction(self.act_export)
        m_file.addSeparator()
        m_file.addAction(act_quit)

        m_run = mb.addMenu("&Run")
        self.act_run = QAction("&Run both arms", self, triggered=lambda _checked=False: self.run())
        self.act_run.setShortcuts([QKeySequence("Ctrl+R"), QKeySequence("F5")])
        self.act_cancel = QAction("&Cancel", self, shortcut=QKeySequence("Esc"), triggered=self.cancel)
        self.act_next = QAction("&Next mismatch", self, shortcut=QKeySequence("F8"), triggered=self.next_mismatch)
        self.act_prev = QAction("&Previous mismatch", self, shortcut=QKeySequence("Shift+F8"),
                                triggered=self.previous_mismatch)
        self.act_fork = QAction("Go to the &fork", self, shortcut=QKeySequence("Ctrl+J"), triggered=self.jump_to_fork)
        self.act_matrix = QAction("Run &matrix…", self, shortcut=QKeySequence("Ctrl+M"),
                                  triggered=lambda _checked=False: self.run_matrix())
        self.act_matrix.setToolTip("run targets x drafters x n_max around the current settings (Esc cancels)")
        m_run.addActions([self.act_run, self.act_matrix, self.act_cancel])
        m_run.addSeparator()
        m_run.addActions([self.act_fork, self.act_next, self.act_prev])
        for a in (self.act_run, self.act_cancel, self.act_next, self.act_prev, self.act_fork, self.act_matrix):
            a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            self.addAction(a)

        m_view = mb.addMenu("&View")
        self.act_boundaries = QAction("Show token &boundaries", self, checkable=True,
                                      shortcut=QKeySequence("Ctrl+B"))
        self.act_boundaries.toggled.connect(self._boundaries_toggled)
        m_view.addAction(self.act_boundaries)
        self.act_sync = QAction("&Scroll panes together", self, checkable=True, checked=True)
        self.act_sync.toggled.connect(lambda on: setattr(self.panes, "sync", on))
        m_view.addAction(self.act_sync)
        m_theme = m_view.addMenu("&Theme")
        self.theme_group = QActionGroup(self)
        self.theme_actions = {}
        for name, label in (("system", "&System"), ("light", "&Light"), ("dark", "&Dark")):
            a = QAction(label, self, checkable=True)
            a.triggered.connect(lambda _c=False, n=name: self.apply_theme(n))
            self.theme_group.addAction(a)
            m_theme.addAction(a)
            self.theme_actions[name] = a
        m_view.addAction(self.controls_dock.toggleViewAction())

    def _connect_worker(self) -> None:
        w = self.host.worker
        w.sigRunStarted.connect(self._on_started)
        w.sigArmStarted.connect(self._on_arm_started)
        w.sigStep.connect(self._on_step)
        w.sigRound.connect(self._on_round)
        w.sigFinished.connect(self._on_finished)
        w.sigFailed.connect(self._on_failed)
        w.sigProgress.connect(self._on_progress)
        w.sigDerived.connect(self._on_derived)
        w.sigPreloaded.connect(self._on_preloaded)
        w.sigMatrixCell.connect(self._on_matrix_cell)
        w.sigMatrixFinished.connect(self._on_matrix_finished)

    # ------------------------------------------------------------ settings
    def _read_settings(self) -> dict[str, Any]:
        if self.settings_path is None or not self.settings_path.exists():
            return {}
        try:
            d = json.loads(self.settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in d.items() if k in DEFAULTS or k == "geometry"} if isinstance(d, dict) else {}

    def _apply_settings_to_controls(self, s: dict[str, Any] | None = None) -> None:
        s = s or self.settings
        self._suspend_auto = True
        try:
            blockers = [QSignalBlocker(w) for w in (self.n_max, self.n_min, self.p_min, self.max_tokens,
                                                     self.ignore_eos, self.chat, self.flash_attn, self.gpu_layers,
                                                     self.n_ctx, self.threads, self.spec_type, self.auto_run,
                                                     self.diagnose, self.prompt)]
            for name in s.get("recent", []) or []:
                for picker in (self.target, self.draft):
                    if picker.combo.findText(name) < 0:
                        picker.combo.addItem(name)
            engine = s.get("engine") if s.get("engine") in ENGINES else DEFAULTS["engine"]
            with QSignalBlocker(self.engine):
                self.engine.setCurrentText(engine)
            self.server_bin.setText(str(s.get("server_bin") or ""))
            self.server_args.setText(str(s.get("server_args") or ""))
            self._show_server_rows(engine)
            self._offer_spec_types(engine, str(s.get("spec_type", "draft-simple")))
            for picker in (self.target, self.draft):
                picker.set_engine(engine)
            self.target.set_value(str(s.get("target") or DEFAULTS["target"]))
            self.draft.set_value(str(s.get("draft") or DEFAULTS["draft"]))
            i = self.spec_type.findData(s.get("spec_type", "draft-simple"))
            self.spec_type.setCurrentIndex(max(0, i))
            self.n_max.setValue(int(s.get("n_max", 3)))
            self.n_min.setValue(int(s.get("n_min", 0)))
            self.p_min.setValue(float(s.get("p_min", 0.0)))
            self.max_tokens.setValue(int(s.get("max_tokens", 256)))
            self.ignore_eos.setChecked(bool(s.get("ignore_eos", False)))
            self.chat.setChecked(bool(s.get("chat", True)))
            self.flash_attn.setCurrentText(str(s.get("flash_attn", "auto")))
            self.gpu_layers.setValue(int(s.get("gpu_layers", -1)))
            self.n_ctx.setValue(int(s.get("n_ctx", 0)))
            self.threads.setValue(int(s.get("threads", 0)))
            self.auto_run.setChecked(bool(s.get("auto_run", True)))
            self.diagnose.setChecked(bool(s.get("diagnose", True)))
            text = s.get("prompt")
            self.prompt.setPlainText(str(text if text is not None else DEFAULTS["prompt"]))
            self._sync_prompt_choice()
            del blockers
            self.draft.setEnabled(self.spec_type.currentData() == "draft-simple")
            for w in (self.n_max, self.n_min, self.p_min):
                w.setEnabled(self.spec_type.currentData() == "draft-simple")
            with QSignalBlocker(self.act_boundaries):
                self.act_boundaries.setChecked(bool(s.get("boundaries", False)))
            self.panes.set_boundaries(bool(s.get("boundaries", False)))
        finally:
            self._suspend_auto = False

    def controls_state(self) -> dict[str, Any]:
        return {
            "engine": self.engine.currentText(),
            "server_bin": self.server_bin.text().strip(),
            "server_args": self.server_args.text().strip(),
            "target": self.target.value(),
            "draft": self.draft.value(),
            "spec_type": self.spec_type.currentData(),
            "n_max": self.n_max.value(),
            "n_min": self.n_min.value(),
            "p_min": round(self.p_min.value(), 6),
            "max_tokens": self.max_tokens.value(),
            "ignore_eos": self.ignore_eos.isChecked(),
            "flash_attn": self.flash_attn.currentText(),
            "gpu_layers": self.gpu_layers.value(),
            "n_ctx": self.n_ctx.value(),
            "threads": self.threads.value(),
            "chat": self.chat.isChecked(),
            "prompt": self.prompt.toPlainText(),
            "diagnose": self.diagnose.isChecked(),
            "auto_run": self.auto_run.isChecked(),
            "boundaries": self.act_boundaries.isChecked(),
            "theme": self.settings.get("theme", "system"),
        }

    def save_settings(self) -> None:
        if self.settings_path is None:
            return
        s = self.controls_state()
        recent = [x for x in self.settings.get("recent", []) or [] if isinstance(x, str)]
        for name in (s["target"], s["draft"]):
            if name and not name.lower().startswith("demo") and name not in recent:
                recent.insert(0, name)
        s["recent"] = recent[:12]
        s["geometry"] = base64.b64encode(bytes(self.saveGeometry())).decode("ascii")
        try:
            self.settings_path.parent.mkdir(parents=True, exist_ok=True)
            from ..core.trace import write_atomic

            write_atomic(self.settings_path, json.dumps(s, indent=1))
        except (OSError, SpecviewError):
            pass

    def _restore_geometry(self) -> None:
        g = self.settings.get("geometry")
        if isinstance(g, str):
            try:
                self.restoreGeometry(QByteArray(base64.b64decode(g)))
                return
            except (ValueError, TypeError):
                pass
        screen = QApplication.primaryScreen()
        avail = screen.availableGeometry() if screen is not None else None
        if avail is not None and avail.width() <= 1700 and avail.height() <= 1100:
            self.setGeometry(avail)  # a small screen: use all of it
        else:
            self.resize(1480, 920)

    # ------------------------------------------------------------- config
    def build_config(self) -> RunConfig:
        """The run the controls describe; raises SpecviewError naming a bad value."""
        s = self.controls_state()
        prompt = s["prompt"].strip()
        if not prompt:
            raise SpecviewError("the prompt is empty: type a prompt or pick a built-in one")
        if not s["target"]:
            raise SpecviewError("no target model: pick a demo quantization or a GGUF file")
        engine = EngineSettings(n_ctx=s["n_ctx"], flash_attn=s["flash_attn"], gpu_layers=s["gpu_layers"],
                                threads=s["threads"])
        return RunConfig(
            target=s["target"],
            draft=s["draft"] or None,
            spec_type=s["spec_type"],
            n_max=s["n_max"],
            n_min=s["n_min"],
            p_min=s["p_min"],
            max_tokens=s["max_tokens"],
            prompt=prompt,
            chat=s["chat"],
            ignore_eos=s["ignore_eos"],
            backend=s["engine"],
            engine=engine,
        )

    def set_controls(self, **values: Any) -> None:
        """Set controls by setting name (``p_min=1.0``...) as a user would; auto re-run follows if on."""
        s = self.controls_state()
        s.update(values)
        self._apply_settings_to_controls(s)
        if "engine" in values and not self._check_engine():
            return
        self._control_changed()

    # ---------------------------------------------------------- control changes
    def _control_changed(self, *_a: Any) -> None:
        if self._suspend_auto:
            return
        self._schedule_auto(AUTO_RUN_MS)

    def _schedule_auto(self, ms: int) -> None:
        if self.auto_run.isChecked() and not self._suspend_auto:
            self.auto_timer.start(ms)

    def _auto_run(self) -> None:
        if self.auto_run.isChecked() and self.matrix_request is None:  # never cancel a matrix behind the user's back
            self.run()

    def _engine_changed(self, *_a: Any) -> None:
        name = self.engine.currentText()
        for picker in (self.target, self.draft):
            picker.set_engine(name)
        self._show_server_rows(name)
        if self._check_engine():
            self._offer_spec_types(name, self.spec_type.currentData())
            self._control_changed()

    def _show_server_rows(self, engine: str) -> None:
        form = self.engine.parentWidget().layout()
        for w in self._server_rows:
            w.setVisible(engine == "llama-server")
            label = form.labelForField(w) if isinstance(form, QFormLayout) else None
            if label is not None:
                label.setVisible(engine == "llama-server")

    def _offer_spec_types(self, engine: str, keep: str | None) -> None:
        """The drafter list: the in-process drafters, plus every spec type the user's llama-server offers."""
        extra: list[str] = []
        if engine == "llama-server" and getattr(self, "engine_problem", None) is None:
            from ..backends.server import find_server_bin, server_spec_types

            try:
                extra = [t for t in server_spec_types(find_server_bin(self.server_bin.text().strip() or None))
                         if t not in SPEC_TYPES]
            except SpecviewError:
                extra = []
        with QSignalBlocker(self.spec_type):
            for i in range(self.spec_type.count() - 1, -1, -1):
                if self.spec_type.itemData(i) not in SPEC_TYPES:
                    self.spec_type.removeItem(i)
            for t in extra:
                self.spec_type.addItem(f"{t} (llama-server)", t)
            i = self.spec_type.findData(keep)
            self.spec_type.setCurrentIndex(max(0, i))

    def _check_engine(self) -> bool:
        """Show why the chosen engine cannot run here, if it cannot; True when it can."""
        name = self.engine.currentText()
        self.engine_problem = engine_problem(name, self.server_bin.text().strip())
        if self.engine_problem is None:
            if self.verdict_kind == "warn" and "engine is not available" in self.verdict.text():
                self._set_verdict(f"Engine {html.escape(name)} ready. Press Run (Ctrl+R / F5).", "info")
            self._set_status(f"engine {name}")
            return True
        self.auto_timer.stop()
        self._set_verdict(f"<b>The {html.escape(name)} engine is not available</b>: "
                          f"{html.escape(self.engine_problem)}<br>Choose llama.cpp in Models ▸ Engine to run here.",
                          "warn")
        self.verdict.setToolTip("")
        self._set_status(f"{name} unavailable: {self.engine_problem}")
        return False

    def _spec_type_changed(self, *_a: Any) -> None:
        on = self.spec_type.currentData() == "draft-simple"
        self.draft.setEnabled(on)
        for w in (self.n_max, self.n_min, self.p_min):
            w.setEnabled(on)
        self._control_changed()

    def _prompt_chosen(self, i: int) -> None:
        text = self.prompt_choice.itemData(i)
        if text:
            self.prompt.setPlainText(text)

    def _sync_prompt_choice(self) -> None:
        text = self.prompt.toPlainText().strip()
        idx = 0
        for i in range(1, self.prompt_choice.count()):
            if self.prompt_choice.itemData(i) == text:
                idx = i
        with QSignalBlocker(self.prompt_choice):
            self.prompt_choice.setCurrentIndex(idx)

    def _prompt_edited(self) -> None:
        self._sync_prompt_choice()
        if not self._suspend_auto:
            self._schedule_auto(AUTO_RUN_PROMPT_MS)

    def _boundaries_toggled(self, on: bool) -> None:
        self.panes.set_boundaries(on)

    # --------------------------------------------------------------- running
    def run(self, *, reuse_vanilla: bool = True) -> RunRequest | None:
        """Run both arms with the current controls (cancelling any run in progress)."""
        self.auto_timer.stop()
        try:
            cfg = self.build_config()
        except SpecviewError as exc:
            self.show_error(str(exc))
            return None
        return self.run_config(cfg, reuse_vanilla=reuse_vanilla, apply=False)

    def run_config(self, cfg: RunConfig, *, reuse_vanilla: bool = True, apply: bool = True) -> RunRequest | None:
        """Run exactly ``cfg`` (a matrix cell's, say), showing its settings in the controls first."""
        self.auto_timer.stop()
        if apply:
            self._controls_from_config(cfg)
        problem = (engine_problem(cfg.backend, self.server_bin.text().strip())
                   if cfg.backend != "llama.cpp" else None)
        if problem is not None:
            self.show_error(f"the {cfg.backend} engine is not available: {problem}")
            return None
        self.matrix_request = None  # submitting cancels a running matrix
        self.tabs.setCurrentIndex(0)
        req = RunRequest(cfg, diagnose=self.diagnose.isChecked(), reuse_vanilla=reuse_vanilla,
                         server_bin=self.server_bin.text().strip() or None,
                         server_args=self.server_args.text().strip())
        self.request = req
        self.live = Live(request=req, started=time.perf_counter())
        self.last_error = None
        self.host.submit(req)
        self._set_busy(True, "starting…")
        return req

    def cancel(self) -> None:
        if self.busy and self.matrix_request is not None:
            self.host.cancel()
            self._set_status("cancelling the matrix (stops within one forward pass)…")
        elif self.busy and self.request is not None:
            self.host.cancel()
            self._set_status("cancelling (stops within one forward pass)…")
        self.auto_timer.stop()

    def _current(self, rid: int) -> bool:
        return self.request is not None and rid == self.request.id

    def _on_started(self, ev: RunStarted) -> None:
        if not self._current(ev.request_id):
            return
        self._set_status("running…")
        self._paint_mark = PaintClock.seconds
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.start()

    def _on_arm_started(self, ev: ArmStarted) -> None:
        if not self._current(ev.request_id):
            return
        arm = ev.arm
        self.live.steps[arm] = []
        self.live.pending[arm] = []
        self.live.margins[arm] = []
        if arm == "speculative":
            self.live.rounds = []
        self.live.first_diff = None
        self.panes.pane(arm).clear_tokens()
        if arm == "vanilla":
            # a fresh run: forget the old trace's marks everywhere
            self.trace = None
            self.act_save.setEnabled(False)
            self.act_export.setEnabled(False)
            self.panes.clear()
            self.margin_plot.mark_fork(None)
            self.margin_plot.mark_token(None)
            self.margin_plot.set_diagnosis(None, [])
            self.acceptance.mark_fork(None)
            self.acceptance.mark_token(None)
            self.acceptance.set_rounds([])
        self.live.dirty = True
        self._set_status(f"{arm} arm…")

    def _on_step(self, ev: StepEvent) -> None:
        if not self._current(ev.request_id):
            return
        live = self.live
        live.steps[ev.arm].append(ev.step)
        live.pending[ev.arm].append(ev.step)
        m = ev.step.margin
        live.margins[ev.arm].append(m if m is not None and math.isfinite(m) else math.nan)
        if ev.arm == "speculative" and live.first_diff is None:
            i = ev.step.index
            v = live.steps["vanilla"]
            if i >= len(v) or v[i].token != ev.step.token:
                live.first_diff = i
        live.dirty = True

    def _on_round(self, ev: RoundEvent) -> None:
        if not self._current(ev.request_id):
            return
        self.live.rounds.append(ev.round)
        self.live.dirty = True

    def flush(self) -> None:
        """Render what streamed in since the last frame (GUI thread, at most ~30 times a second)."""
        live = self.live
        if not live.dirty:
            return
        live.dirty = False
        t0 = time.perf_counter()
        try:
            self._render_live(live)
        finally:
            # frame budget: this frame's updates plus the painting since the last frame may use at
            # most DRAW_SHARE of the time, so drawing never slows the model threads noticeably
            # (on 2 cores every millisecond the GUI thread draws is taken from llama.cpp)
            painted = PaintClock.seconds - self._paint_mark
            self._paint_mark = PaintClock.seconds
            cost_ms = (time.perf_counter() - t0 + painted) * 1000.0
            self.frame_timer.setInterval(int(min(MAX_FRAME_MS, max(FRAME_MS, cost_ms / DRAW_SHARE))))
            self.frames += 1

    def _render_live(self, live: "Live") -> None:
        for arm in ("vanilla", "speculative"):
            if live.pending[arm]:
                self.panes.pane(arm).append_steps(live.pending[arm])
                live.pending[arm] = []
                if arm == "speculative" and self.panes.speculative.follow:
                    # while the second arm streams, show the first at the same place in the text
                    last = len(live.steps["speculative"]) - 1
                    self.panes.align_on(self.panes.speculative, self.panes.vanilla, last)
        import numpy as np

        x_max = live.request.cfg.max_tokens if live.request is not None else None
        self.margin_plot.set_arrays(np.asarray(live.margins["vanilla"], float),
                                    np.asarray(live.margins["speculative"], float), x_max=x_max)
        self.acceptance.set_rounds(live.rounds, streaming=True)
        if live.first_diff is not None:
            self.margin_plot.mark_fork(live.first_diff)
        req = live.request
        if req is not None:
            nv, ns = len(live.steps["vanilla"]), len(live.steps["speculative"])
            total = req.cfg.max_tokens
            self.progress.setRange(0, 2 * total)
            self.progress.setValue(min(2 * total, nv + ns))
            fork = f" · arms differ from token {live.first_diff}" if live.first_diff is not None else ""
            self._set_verdict(f"Running: vanilla {nv}/{total} tokens, speculative {ns}/{total}{fork}", "info")

    def _on_progress(self, ev: Progress) -> None:
        # progress messages come while models load or derive and while the fork is diagnosed,
        # not while tokens stream: show an indeterminate bar until the next tokens arrive
        if self.busy:
            self.progress.setRange(0, 0)
        self._set_status(ev.message)

    def _on_preloaded(self, rid: int) -> None:
        if self._preload is not None and rid == self._preload.id:
            self._preload = None
            if not self.busy_run():
                self._set_busy(False, "models loaded; press Run (Ctrl+R)")

    def busy_run(self) -> bool:
        return self.request is not None and self.busy and self.last_finished_id() != self.request.id

    def last_finished_id(self) -> int | None:
        return self.last_finished.request_id if self.last_finished else None

    def _on_finished(self, ev: RunFinished) -> None:
        if not self._current(ev.request_id):
            return
        self.frame_timer.stop()
        self.flush()
        self.last_finished = ev
        self.counters.setText(f"runs: vanilla {ev.vanilla_runs} · speculative {ev.speculative_runs} · "
                              f"models loaded {ev.loads}")
        self._set_busy(False, f"finished in {ev.seconds:.1f} s" + (" (cancelled)" if ev.cancelled else ""))
        self.show_trace(ev.trace, cancelled=ev.cancelled, diagnosis_error=ev.diagnosis_error)

    def _on_failed(self, ev: RunFailed) -> None:
        if self._derive is not None and ev.request_id == self._derive.id:
            self._derive = None
            self._set_busy(False, "")
            self.show_error(ev.message, ev.details)
            return
        if self._preload is not None and ev.request_id == self._preload.id:
            self._preload = None
            self._set_busy(False, "")
            self.show_error(ev.message, ev.details)
            return
        if self.matrix_request is not None and ev.request_id == self.matrix_request.id:
            self.matrix_request = None
            self._set_busy(False, "")
            self.show_error(f"the matrix stopped: {ev.message}", ev.details)
            return
        if not self._current(ev.request_id):
            return
        self.frame_timer.stop()
        self.flush()
        self._set_busy(False, "")
        self.show_error(ev.message, ev.details)

    # ------------------------------------------------------------ matrix
    def run_matrix(self, spec: Any = None, *, out_dir: str | os.PathLike[str] | None = None) -> MatrixRequest | None:
        """Run a reproducer matrix on the model worker, streaming its cells into the Matrix tab.

        Without ``spec`` a dialog offers targets, drafters and n_max around the
        current controls.  The matrix JSON and each cell's trace are written to
        ``out_dir`` (a fresh temporary folder by default), so a finished cell
        opens side by side without running again.
        """
        from ..core.matrix import MatrixRun, expand

        self.auto_timer.stop()
        if spec is None:
            try:
                cfg = self.build_config()
            except SpecviewError as exc:
                self.show_error(str(exc))
                return None
            from .matrix_run import MatrixDialog

            dlg = MatrixDialog(cfg, diagnose=self.diagnose.isChecked(), parent=self)
            if dlg.exec() != MatrixDialog.DialogCode.Accepted:
                return None
            try:
                spec = dlg.spec()
            except SpecviewError as exc:
                self.show_error(str(exc))
                return None
        try:
            spec.validate()
        except SpecviewError as exc:
            self.show_error(str(exc))
            return None
        problem = engine_problem(spec.backend) if spec.backend != "llama.cpp" else None
        if problem is not None:
            self.show_error(f"the {spec.backend} engine is not available: {problem}")
            return None
        folder = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="specview-matrix-"))
        out = folder / "matrix.json"
        req = MatrixRequest(spec, out=str(out), traces_dir=str(folder / "traces"))
        self.matrix_view.setMatrix(MatrixRun(spec=spec, cells=expand(spec)).to_json(), source=out)
        self.tabs.setCurrentWidget(self.matrix_view)
        self.request = None  # a run still streaming is cancelled by the submit below; its events are stale
        self.frame_timer.stop()
        self.matrix_request = req
        self.last_error = None
        self.host.submit_matrix(req)
        self._set_busy(True, f"matrix: 0 of {len(expand(spec))} cells…")
        self._set_verdict(f"Running a matrix of {len(expand(spec))} cells; Esc cancels.", "info")
        return req

    def _on_matrix_cell(self, ev: MatrixCell) -> None:
        if self.matrix_request is None or ev.request_id != self.matrix_request.id:
            return
        self.matrix_view.addCell(ev.record)
        done = len(self.matrix_view.doc.get("cells", []))
        total = int(self.matrix_view.doc.get("n_cells", done) or done)
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        self._set_status(f"matrix: {done} of {total} cells")
        self.sigMatrixCell.emit(ev.record)

    def _on_matrix_finished(self, ev: MatrixFinished) -> None:
        if self.matrix_request is None or ev.request_id != self.matrix_request.id:
            return
        req, self.matrix_request = self.matrix_request, None
        self.matrix_view.setMatrix(ev.doc, source=req.out)
        status = ev.doc.get("status", "")
        if self.tabs.currentWidget() is self.matrix_view:  # else a cell opened meanwhile keeps its verdict
            self._show_matrix_verdict(ev.doc, f"written to {req.out}")
        self._set_busy(False, f"matrix {status} in {ev.seconds:.1f} s: {req.out}")
        self.sigMatrixFinished.emit(ev)

    def _show_matrix_verdict(self, doc: dict[str, Any], tooltip: str = "") -> None:
        cells = doc.get("cells", [])
        n, total = len(cells), doc.get("n_cells", len(cells))
        forks = sum(1 for c in cells if c.get("status") == "ok" and not c.get("identical"))
        errors = sum(1 for c in cells if c.get("status") == "error")
        status = doc.get("status", "")
        head = {"interrupted": "Matrix cancelled", "running": "Matrix still running"}.get(status, "Matrix complete")
        text = f"<b>{head}</b>: {n} of {total} cells, {forks} forked, {errors} failed."
        if n:
            text += "<br><i>Double-click a cell (or press Enter on it) to open it side by side.</i>"
        # a near-tie fork is expected numerics, not a bug: only a state bug, nondeterminism or an
        # undiagnosed fork colours the bar as a mismatch
        bad = any(c.get("verdict") in ("state", "nondeterministic", "diverged") for c in cells)
        kind = "bad" if bad else ("warn" if forks or errors or status != "complete" else "ok")
        self._set_verdict(text, kind)
        self.verdict.setToolTip(tooltip)

    def open_matrix(self, path: str | os.PathLike[str]) -> bool:
        """Show a ``specview.matrix/1`` file in the Matrix tab."""
        try:
            self.matrix_view.loadFile(path)
        except SpecviewError as exc:
            self.show_error(str(exc))
            return False
        self.tabs.setCurrentWidget(self.matrix_view)
        self._show_matrix_verdict(self.matrix_view.doc, str(path))
        self._set_status(f"matrix {path}")
        return True

    def _open_matrix_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a specview matrix", str(Path.cwd()),
                                              "specview matrices (*.json);;All files (*)")
        if path:
            self.open_matrix(path)

    def _open_cell(self, cfg: RunConfig | None, trace_path: str | None) -> None:
        """A double-clicked matrix cell: its saved trace when there is one, else a run of its config."""
        if trace_path and self.open_trace(trace_path) is not None:
            self.tabs.setCurrentIndex(0)
            return
        if cfg is not None:
            self.run_config(cfg)

    def _controls_from_config(self, cfg: RunConfig) -> None:
        s = self.controls_state()
        s.update(target=cfg.target, spec_type=cfg.spec_type, n_max=cfg.n_max, n_min=cfg.n_min, p_min=cfg.p_min,
                 max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos, chat=cfg.chat,
                 flash_attn=cfg.engine.flash_attn, gpu_layers=cfg.engine.gpu_layers, n_ctx=cfg.engine.n_ctx,
                 threads=cfg.engine.threads)
        if cfg.draft:
            s["draft"] = cfg.draft
        if cfg.backend in ENGINES:
            s["engine"] = cfg.backend
        if cfg.prompt is not None:
            s["prompt"] = cfg.prompt
        try:
            self._apply_settings_to_controls(s)
        except (TypeError, ValueError):
            pass
        self.auto_timer.stop()

    # ------------------------------------------------------------ report
    def export_report(self, folder: str | os.PathLike[str]) -> dict[str, Path] | None:
        """Write the HTML and Markdown report of the trace on screen into ``folder`` (plots drawn here, on the
        GUI thread)."""
        if self.trace is None:
            self.show_error("no trace to report yet: run both arms or open a saved trace first")
            return None
        from ..report import write_report

        self._set_status(f"writing the report into {folder}…")
        try:
            written = write_report(self.trace, folder)
        except (SpecviewError, OSError) as exc:
            self.show_error(f"{folder}: could not write the report ({exc})")
            return None
        self._set_status(f"report written: {written['html']} and {written['markdown']}")
        self.sigReportWritten.emit(written)
        return written

    def _export_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder for the report (report.html, report.md and plots)",
                                                  str(Path.cwd()))
        if folder:
            self.export_report(folder)

    def _set_busy(self, busy: bool, status: str) -> None:
        self.busy = busy
        self.cancel_button.setEnabled(busy)
        self.progress.setVisible(busy)
        if busy:
            self.progress.setRange(0, 0)
        self._set_status(status)
        self.sigBusy.emit(busy)

    def _set_status(self, msg: str) -> None:
        self.status_label.setText(msg)

    # ------------------------------------------------------------ derivation
    def derive(self, choice: gmodels.QuantChoice, role: str) -> None:
        if choice.source is None:
            return
        engine = (self.target if role == "target" else self.draft).engine
        self._derive = self.host.derive(DeriveRequest(choice.source, choice.path, choice.quant, engine=engine))
        self._derive_role = role
        self._set_busy(True, f"deriving {choice.quant} from {Path(choice.source).name}…")

    def _on_derived(self, ev: Derived) -> None:
        if self._derive is None or ev.request_id != self._derive.id:
            return
        self._derive = None
        self._set_busy(False, f"derived {ev.quant} in {ev.seconds:.1f} s: {ev.path}")
        picker = self.target if self._derive_role == "target" else self.draft
        picker.set_value(ev.path, emit=True)

    # ---------------------------------------------------------- displaying
    def show_trace(self, trace: Trace, *, cancelled: bool = False, diagnosis_error: str | None = None) -> None:
        """Show a finished or opened trace: panes, plots, marks, verdict."""
        self.trace = trace
        self.act_save.setEnabled(True)
        self.act_export.setEnabled(True)
        v, s = trace.vanilla, trace.speculative
        self.panes.vanilla.set_steps(v.steps)
        self.panes.speculative.set_steps(s.steps)
        self.live.pending = {"vanilla": [], "speculative": []}
        self.margin_plot.set_steps(v.steps, s.steps)
        self.acceptance.set_rounds(s.rounds, rate=s.acceptance_rate, mean=s.mean_accepted)
        fm = trace.comparison.first_mismatch
        diffs = mismatch_positions(v.tokens, s.tokens)
        self.diffs = diffs
        fork = fm.index if fm is not None else None
        self.panes.set_mismatch(fork)
        vm = v.steps[fork].margin if fork is not None and fork < len(v.steps) else None
        self.margin_plot.mark_fork(fork, vm)
        self.acceptance.mark_fork(fork)
        diag_note = self.margin_plot.set_diagnosis(trace.diagnosis, v.steps)
        self._show_verdict(trace, cancelled=cancelled, diagnosis_error=diagnosis_error, diag_note=diag_note)
        if fork is not None:
            self.select_token(fork, scroll=True)
            # the verdict bar may have grown and shrunk the panes: centre the fork again once laid out
            QTimer.singleShot(0, lambda t=trace, i=fork: self._recentre(t, i))
        self.sigTraceShown.emit(trace)

    def _recentre(self, trace: Trace, i: int) -> None:
        if self.trace is trace and self.panes.selected == i:
            self.panes.jump_to(i)

    def _show_verdict(self, trace: Trace, *, cancelled: bool, diagnosis_error: str | None, diag_note: str) -> None:
        v, s, c = trace.vanilla, trace.speculative, trace.comparison
        fm = c.first_mismatch
        diag = trace.diagnosis if isinstance(trace.diagnosis, dict) else None
        parts: list[str] = []
        if cancelled:
            kind = "warn"
            parts.append(f"<b>Cancelled</b> after {len(v.tokens)} vanilla and {len(s.tokens)} speculative tokens.")
            if fm is not None and fm.index < min(len(v.tokens), len(s.tokens)):
                parts.append(f"The arms already differ at token {fm.index}.")
        elif c.identical:
            kind = "ok"
            parts.append(f"<b>Identical</b>: both arms produced the same {c.n_vanilla} tokens.")
        else:
            # amber for a near-tie (expected numerics), red for a state bug, nondeterminism or no diagnosis,
            # the same colours as the matrix grid and the report
            kind = "warn" if diag and str(diag.get("verdict", "")).replace("_", "-") == "near-tie" else "bad"
            i = fm.index
            vm = v.steps[i].margin if i < len(v.steps) else None
            sm = s.steps[i] if i < len(s.steps) else None
            what = f"<b>Forked at token {i}</b>: vanilla {html.escape(repr(fm.vanilla_piece))} vs speculative " \
                   f"{html.escape(repr(fm.speculative_piece))}"
            label = verdict_label(diag)
            if label:
                what += f" — <b>{html.escape(label)}</b>"
            parts.append(what + ".")
            nums = [f"vanilla margin {fmt_margin(vm)}"]
            if sm is not None:
                nums.append(f"speculative margin {fmt_margin(sm.margin)} ({step_origin(sm)})")
            if diag:
                gap = diag.get("gap")
                if isinstance(gap, (int, float)) and math.isfinite(gap):
                    nums.append(f"replay gap {gap:.4f}")
            nums.append(f"{c.agree} tokens agree; {len(self.diffs)} differing positions")
            parts.append(" · ".join(nums))
        if diagnosis_error:
            parts.append(f"<i>diagnosis failed: {html.escape(diagnosis_error)}</i>")
        elif diag:
            expl = diag.get("explanation")
            if isinstance(expl, str) and expl.strip():
                parts.append(f"<i>{html.escape(expl.strip())}</i>")
            elif diag_note:
                parts.append(f"<i>diagnosis: {html.escape(diag_note)}</i>")
        self._set_verdict("<br>".join(parts), kind)
        self.verdict.setToolTip(diagnosis_tooltip(diag))
        self.speed.setText(speed_text(trace))

    def _set_verdict(self, text: str, kind: str) -> None:
        if kind == getattr(self, "verdict_kind", None) and getattr(self, "_verdict_palette_key", None) == \
                self.palette().cacheKey():
            if text != self.verdict.text():
                self.verdict.setText(text)
            return
        self._verdict_palette_key = self.palette().cacheKey()
        pal = self.palette()
        base = pal.color(QPalette.ColorRole.Window)
        hue = {"ok": OK_HUE, "bad": MISMATCH_HUE, "warn": WARN_HUE, "error": MISMATCH_HUE}.get(kind)
        bg = blend(base, hue, 0.30 if is_dark(pal) else 0.22) if hue is not None else base
        vp = self.verdict.palette()
        vp.setColor(QPalette.ColorRole.Window, bg)
        vp.setColor(QPalette.ColorRole.WindowText, pal.color(QPalette.ColorRole.WindowText))
        self.verdict.setPalette(vp)
        self.verdict.setText(text)
        self.verdict_kind = kind

    def show_error(self, message: str, details: str = "") -> None:
        """Show an error in the verdict bar (the window stays usable)."""
        self.last_error = message
        self._set_verdict(f"<b>Error</b>: {html.escape(message)}".replace("\n", "<br>"), "error")
        self.verdict.setToolTip(details or "")
        self._set_status("error")
        self.sigError.emit(message)

    # ------------------------------------------------------------ selection
    def _token_selected(self, i: int) -> None:
        self.select_token(i, scroll=False, from_pane=True)

    def select_token(self, i: int | None, *, scroll: bool = False, from_pane: bool = False) -> None:
        if not from_pane:
            self.panes.select(i, emit=False, scroll=scroll)
        self.margin_plot.mark_token(i)
        self.acceptance.mark_token(i)
        if i is not None:
            self._set_status(self._token_status(i))

    def _token_status(self, i: int) -> str:
        bits = [f"token {i}"]
        for p in self.panes.panes:
            if i < len(p.steps):
                st = p.steps[i]
                bits.append(f"{p.arm} {st.piece!r} margin {fmt_margin(st.margin)}")
        return " · ".join(bits)

    def mismatches(self) -> list[int]:
        if self.trace is not None:
            return list(self.diffs)
        return mismatch_positions([s.token for s in self.live.steps["vanilla"]],
                                  [s.token for s in self.live.steps["speculative"]])

    def next_mismatch(self) -> int | None:
        cur = self.panes.selected
        for i in self.mismatches():
            if cur is None or i > cur:
                self.select_token(i, scroll=True)
                return i
        self._set_status("no further mismatch")
        return None

    def previous_mismatch(self) -> int | None:
        cur = self.panes.selected
        for i in reversed(self.mismatches()):
            if cur is None or i < cur:
                self.select_token(i, scroll=True)
                return i
        self._set_status("no earlier mismatch")
        return None

    def jump_to_fork(self) -> None:
        if self.trace is not None and self.trace.comparison.first_mismatch is not None:
            self.select_token(self.trace.comparison.first_mismatch.index, scroll=True)

    # ------------------------------------------------------------ files
    def open_trace(self, path: str | os.PathLike[str]) -> Trace | None:
        """Open a saved trace and show it as a live one (no model needed); a matrix file opens in the Matrix tab."""
        if is_matrix_file(path):
            self.open_matrix(path)
            return None
        try:
            trace = Trace.load(path)
        except SpecviewError as exc:
            self.show_error(str(exc))
            return None
        if self.busy and self.matrix_request is None:  # a running matrix goes on; its cells stay openable
            self.cancel()
            self._set_busy(False, "")  # the cancelled run's events are stale from here on
        self.request = None
        self.frame_timer.stop()
        self.live = Live()
        self.panes.clear()
        self._controls_from_trace(trace)
        self.setWindowTitle(f"specview — {Path(path).name}")
        self.counters.setText("")
        self.show_trace(trace)
        return trace

    def _controls_from_trace(self, trace: Trace) -> None:
        cfg = trace.config if isinstance(trace.config, dict) else {}
        eng = cfg.get("engine") if isinstance(cfg.get("engine"), dict) else {}
        s = self.controls_state()
        for key in ("target", "draft", "spec_type", "n_max", "n_min", "p_min", "max_tokens", "ignore_eos", "chat"):
            if cfg.get(key) is not None:
                s[key] = cfg[key]
        if cfg.get("backend") in ENGINES:
            s["engine"] = cfg["backend"]
        for key in ("flash_attn", "gpu_layers", "n_ctx", "threads"):
            if eng.get(key) is not None:
                s[key] = eng[key]
        text = (trace.prompt or {}).get("text") if isinstance(trace.prompt, dict) else None
        if text:
            s["prompt"] = text
        try:
            self._apply_settings_to_controls(s)
        except (TypeError, ValueError):
            pass
        self.auto_timer.stop()

    def save_trace(self, path: str | os.PathLike[str]) -> Path | None:
        if self.trace is None:
            self.show_error("nothing to save yet: run both arms first")
            return None
        try:
            p = self.trace.save(path)
        except (SpecviewError, OSError) as exc:
            self.show_error(f"{path}: could not save the trace ({exc})")
            return None
        self._set_status(f"saved {p}")
        return p

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a specview trace or matrix", str(Path.cwd()),
                                              "specview traces and matrices (*.json);;All files (*)")
        if path:
            self.open_trace(path)

    def _save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the trace", str(Path.cwd() / "trace.json"),
                                              "specview traces (*.json)")
        if path:
            self.save_trace(path)

    # ------------------------------------------------------------ theme
    def apply_theme(self, name: str) -> None:
        app = QApplication.instance()
        if name not in ("system", "light", "dark"):
            name = "system"
        self.settings["theme"] = name
        if name in self.theme_actions:
            self.theme_actions[name].setChecked(True)
        if app is not None:
            if name == "dark":
                app.setStyle(QStyleFactory.create("Fusion"))
                app.setPalette(dark_palette())
            elif name == "light":
                app.setStyle(QStyleFactory.create("Fusion"))
                app.setPalette(light_palette())
            else:
                app.setPalette(app.style().standardPalette())
        pal = self.palette() if app is None else app.palette()
        self.acceptance.apply_palette(pal)
        self.margin_plot.apply_palette(pal)
        kind = getattr(self, "verdict_kind", "info")
        self._verdict_palette_key = None
        self._set_verdict(self.verdict.text(), kind)

    # ------------------------------------------------------------ lifecycle
    def shutdown(self) -> bool:
        """Cancel, free the models in their thread, stop and join the worker thread."""
        self.auto_timer.stop()
        self.frame_timer.stop()
        return self.host.stop()

    def closeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        self.save_settings()
        self.shutdown()
        super().closeEvent(ev)


def step_origin(step: Step) -> str:
    """Where a speculative token came from, in words; "n/a" for what the engine did not report."""
    if step.from_draft is None:
        origin = "origin n/a"
    else:
        origin = "accepted draft token" if step.from_draft else "target's own token"
    rnd = "n/a" if step.round is None else step.round
    t = "n/a" if step.batch_size is None else step.batch_size
    return f"{origin}, round {rnd}, batch T={t}"


def verdict_label(diag: dict | None) -> str:
    """A short label from a diagnosis verdict: near-tie / state bug / nondeterministic ..."""
    if not diag:
        return ""
    v = diag.get("verdict")
    if not isinstance(v, str) or not v:
        return ""
    names = {
        "near-tie": "near-tie flip (batched vs single-token numerics)",
        "near_tie": "near-tie flip (batched vs single-token numerics)",
        "state": "state bug (not a near-tie)",
        "state-bug": "state bug (not a near-tie)",
        "nondeterministic": "nondeterministic (vanilla differs from itself)",
        "identical": "identical",
    }
    return names.get(v.lower(), v)


def diagnosis_tooltip(diag: dict | None) -> str:
    if not diag:
        return ""
    lines = []
    for k, v in diag.items():
        if k == "envelope" and isinstance(v, dict):
            v = {kk: vv for kk, vv in v.items() if kk != "series"}
        if isinstance(v, (list, dict)):
            text = json.dumps(v)
            if len(text) > 160:
                text = text[:157] + "…"
        else:
            text = str(v)
        lines.append(f"<b>{html.escape(str(k))}</b>: {html.escape(text)}")
    return "<br>".join(lines)


def speed_text(trace: Trace) -> str:
    v, s = trace.vanilla, trace.speculative
    vt, st = v.tokens_per_s, s.tokens_per_s
    bits = [f"vanilla <b>{vt:.1f}</b> tok/s", f"speculative <b>{st:.1f}</b> tok/s"]
    if vt > 0 and st > 0:
        bits.append(f"speedup <b>{st / vt:.2f}×</b>")
    rate = s.acceptance_rate
    if rate is not None:
        bits.append(f"acceptance {rate * 100:.1f}% ({s.n_accepted}/{s.n_drafted})")
    if s.mean_accepted is not None:
        bits.append(f"mean accepted length {s.mean_accepted:.2f}")
    models = trace.models if isinstance(trace.models, dict) else {}
    tgt = (models.get("target") or {}) if isinstance(models.get("target"), dict) else {}
    drf = (models.get("draft") or {}) if isinstance(models.get("draft"), dict) else {}
    who = tgt.get("file") or trace.config.get("target")
    if who:
        desc = f"target {html.escape(str(who))}"
        if drf.get("file"):
            desc += f", draft {html.escape(str(drf['file']))}"
        elif s.drafter:
            desc += f", drafter {html.escape(str(s.drafter))}"
        bits.append(desc)
    return " · ".join(bits)
