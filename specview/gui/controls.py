"""The run controls, generated from the settings' declarations in :mod:`specview.core.config`.

Every setting of :class:`RunConfig` and :class:`EngineSettings` declared for
the app (``gui=True``) gets one control chosen by its type: a spin box for an
integer, a decimal spin box for a number, a combo box for a choice, a check box
for a flag, a line edit for free text; its label, range and tool tip come from
the declaration, and a setting declared ``only_for`` some engines is shown only
for them (each is a :class:`~specview.gui.setting_control.SettingControl`).  The
few settings with a widget of their own (the engine, the models, the drafter,
the prompt) are laid out around them.

The controls hold a run in the shape of :meth:`RunConfig.to_dict`: :meth:`RunControls.config`
goes through :meth:`RunConfig.from_dict`, :meth:`RunControls.set_config` through
:meth:`RunConfig.to_dict`; there is no other converter.
"""

from __future__ import annotations

import copy
import importlib
import re
from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from ..core.config import (DEMO_DRAFT, DEMO_DRAFTERS, DEMO_TARGET, DRAFT_FILE_TYPES, DRAFT_PARAM_TYPES,
                           EngineSettings, RunConfig, declared, demo_drafter)
from ..core.resolve import DECIDED_KEY, decided
from ..core.demo import is_demo_name
from ..core.errors import ConfigError, SpecviewError
from ..core.registry import (
    BUILTIN_BACKENDS,
    Backend,
    backend_names,
    backend_problem,
    get_backend,
)
from .models.offers import ModelOffers
from .models.picker import ModelPicker
from .setting_control import SettingControl
from .settings import default_run

#: group boxes in panel order, with their titles (a group not listed here gets its name as its title)
GROUPS = {"models": "Models", "speculation": "Speculation (llama.cpp names)", "prompt": "Prompt",
          "engine": "Engine (llama.cpp names)"}
#: how the drafter list describes a spec type (any other type is shown by its name)
SPEC_TYPE_WORDS = {"draft-simple": "draft model (draft-simple)", "ngram-simple": "n-gram (ngram-simple)",
                   "none": "none (verify one token per round)", "draft-mtp": "the target's MTP head (draft-mtp)",
                   "draft-eagle3": "EAGLE-3 drafter (draft-eagle3)", "draft-dflash": "DFlash drafter (draft-dflash)",
                   "draft-dspark": "DSpark drafter (draft-dspark)"}
TOKEN_IDS = "\x00token-ids"  # the prompt list's entry for raw token ids


def parse_token_ids(text: str) -> tuple[int, ...]:
    """``"1, 2 3"`` -> ``(1, 2, 3)``; :class:`ConfigError` naming the first thing that is not a token id."""
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts:
        raise ConfigError("no token ids: type them separated by commas or spaces (e.g. 1, 270, 280)",
                          setting="prompt_tokens")
    out = []
    for p in parts:
        if not p.isdigit():
            raise ConfigError(f"prompt token ids: {p!r} is not a token id (an integer >= 0)", setting="prompt_tokens")
        out.append(int(p))
    return tuple(out)


def probe_engine(name: str, settings: EngineSettings | None = None) -> tuple[str | None, list[str]]:
    """(why the engine ``name`` cannot run here or None, the spec types it offers); its backend's own words."""
    try:
        problem = backend_problem(name)
        if problem is not None:
            return problem, []
        return None, list(get_backend(name).spec_types(settings))  # an engine that needs a binary asks it here
    except SpecviewError as exc:
        return str(exc), []
    except Exception as exc:  # noqa: BLE001 - a broken installation: still a reason, never a traceback
        return f"{type(exc).__name__}: {exc}", []


def engine_problem(name: str, settings: EngineSettings | None = None) -> str | None:
    """Why the engine ``name`` cannot run here, in one line; None when it can."""
    return probe_engine(name, settings)[0]


def run_of_trace(trace: Any) -> RunConfig:
    """The run a saved trace records: ``RunConfig.from_dict(trace.config)``; :class:`ConfigError` if it is not one.

    A trace written before the config block held the prompt takes it from the trace's prompt block.
    """
    d = dict(trace.config) if isinstance(trace.config, dict) else {}
    p = trace.prompt if isinstance(trace.prompt, dict) else {}
    if d.get("prompt") is None and not d.get("prompt_tokens"):
        if p.get("raw_tokens") and isinstance(p.get("tokens"), list):
            d["prompt_tokens"] = p["tokens"]
        elif isinstance(p.get("text"), str):
            d["prompt"] = p["text"]
    return RunConfig.from_dict(d)


def backend_or_none(name: str) -> Backend | None:
    try:
        return get_backend(name)
    except Exception:  # noqa: BLE001 - unavailable engines are listed with their reason elsewhere
        return None


def backend_facts(name: str) -> tuple[str, str]:
    """(label, model kind) of the engine ``name``; for a built-in engine that cannot run here, its class says."""
    src: Any = backend_or_none(name)
    if src is None and name in BUILTIN_BACKENDS:
        module, _, attr = BUILTIN_BACKENDS[name].partition(":")
        try:
            src = getattr(importlib.import_module(module), attr)
        except Exception:  # noqa: BLE001 - not even importable: a name is all there is
            src = None
    return (getattr(src, "label", "") or name), (getattr(src, "model_kind", "") or "gguf")


class RunControls(QWidget):
    """Every setting of a run, as controls; ``config()`` is the run they describe."""

    sigChanged = Signal()  # the user changed a setting (the prompt text has its own signal)
    sigPromptEdited = Signal()
    sigEngineChecked = Signal(str, object)  # (engine name, its problem or None), after the engine or its settings changed
    sigDeriveWanted = Signal(object, str)  # (models.QuantChoice, "target" | "draft")

    def __init__(self, prompts: dict[str, str], parent: QWidget | None = None):
        super().__init__(parent)
        self.prompts = prompts
        self.settings: dict[str, SettingControl] = {}
        self._rows: dict[str, tuple[QFormLayout, QWidget]] = {}
        self._base: dict[str, Any] = default_run()
        self._quiet = False
        self.engine_problem: str | None = None
        self.spec_types: list[str] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        forms: dict[str, QFormLayout] = {}
        #: boxes that hold only generated settings: hidden when none of their settings applies
        self._setting_boxes: dict[str, QGroupBox] = {}
        for group, title in GROUPS.items():
            box = QGroupBox(title)
            box.setObjectName(f"group_{group}")
            forms[group] = QFormLayout(box)
            lay.addWidget(box)
            if group == "models":
                self._build_models(forms[group])
            elif group == "prompt":
                self._build_prompt(forms[group])
        for cls in (RunConfig, EngineSettings):
            for f in declared(cls):
                if not f.metadata.get("gui", True):
                    continue
                group = f.metadata.get("group") or "engine"
                if group not in forms:
                    box = QGroupBox(group.capitalize())
                    forms[group] = QFormLayout(box)
                    lay.addWidget(box)
                    self._setting_boxes[group] = box
                ctl = SettingControl(cls, f, lambda *_a, n=f.name: self._changed(n))
                self.settings[f.name] = ctl
                forms[group].addRow(ctl.label, ctl.widget)
                self._rows[f.name] = (forms[group], ctl.widget)
        # why the weights are not repacked, when this machine chose it (a crashed probe): one line, never silent
        self.repack_note = QLabel("")
        self.repack_note.setObjectName("repack_note")
        self.repack_note.setWordWrap(True)
        self.repack_note.setVisible(False)
        forms["engine"].addRow(self.repack_note)

    # -- the widgets with a layout of their own -------------------------------------------
    def _build_models(self, form: QFormLayout) -> None:
        self.engine = QComboBox()
        self.engine.setObjectName("engine")
        for name in backend_names():
            self.engine.addItem(backend_facts(name)[0], name)
        self.engine.setToolTip("--engine: which inference engine runs both arms")
        self.engine.currentIndexChanged.connect(lambda _i: self._engine_changed())
        form.addRow("Engine", self.engine)
        self.target = ModelPicker("target")
        self.target.sigChanged.connect(lambda _v: (self.offers.refresh_draft(), self._changed("target")))
        self.target.sigDeriveWanted.connect(lambda c: self.sigDeriveWanted.emit(c, "target"))
        form.addRow("Target", self.target)
        self.spec_type = QComboBox()
        self.spec_type.setObjectName("spec_type")
        self.spec_type.setToolTip("--spec-type: how tokens are drafted")
        self.spec_type.currentIndexChanged.connect(lambda _i: self._spec_type_changed())
        form.addRow("Drafter", self.spec_type)
        self.draft = ModelPicker("draft")
        self.draft.sigChanged.connect(lambda _v: (self.offers.check(), self._changed("draft")))
        self.draft.sigDeriveWanted.connect(lambda c: self.sigDeriveWanted.emit(c, "draft"))
        form.addRow("Draft model", self.draft)
        #: the found models in the pickers; only the drafters that fit the target (see models/offers.py)
        self.offers = ModelOffers(self.target, self.draft, self.spec_type, self)

    def _build_prompt(self, form: QFormLayout) -> None:
        self.prompt_choice = QComboBox()
        self.prompt_choice.setObjectName("prompt_choice")
        self.prompt_choice.addItem("(custom)", None)
        self.prompt_choice.addItem("(token ids)", TOKEN_IDS)
        self.prompt_choice.setItemData(1, "raw prompt token ids, fed as they are: no BOS, no template",
                                       Qt.ItemDataRole.ToolTipRole)
        for name, text in self.prompts.items():
            self.prompt_choice.addItem(name, text)
        self.prompt_choice.activated.connect(self._prompt_chosen)
        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("prompt")
        self.prompt.setMinimumHeight(70)
        self.prompt.setMaximumHeight(150)
        self.prompt.textChanged.connect(self._prompt_edited)
        form.addRow(self.prompt_choice)
        form.addRow(self.prompt)

    def __getitem__(self, name: str) -> QWidget:
        """The control of the declared setting ``name``."""
        return self.settings[name].widget

    # -- the run they describe --------------------------------------------------------------
    @property
    def token_mode(self) -> bool:
        return self.prompt_choice.currentData() == TOKEN_IDS

    def backend_name(self) -> str:
        return str(self.engine.currentData() or "")

    def state(self) -> dict[str, Any]:
        """The controls as a :meth:`RunConfig.to_dict`-shaped dict (not checked: it may not be a valid run yet)."""
        d = copy.deepcopy(self._base)
        d.setdefault("engine", {})
        machine = d.pop(DECIDED_KEY, None) or {}
        for name, ctl in self.settings.items():
            src = d if ctl.cls is RunConfig else d["engine"]
            v = ctl.value()
            if (name in machine and machine[name].get("value") == v) or (src.get(name, v) is None and v == ctl.default):
                v = None  # unset, or the machine's decision, left alone: the run decides it (and its trace says why)
            src[name] = v
        d["backend"] = self.backend_name()
        d["target"] = self.target.value()
        d["draft"] = self.draft.value() or None
        d["spec_type"] = self.spec_type.currentData()
        text = self.prompt.toPlainText()
        if self.token_mode:
            try:
                d["prompt_tokens"], d["prompt"] = list(parse_token_ids(text)), None
            except ConfigError:
                d["prompt_tokens"], d["prompt"] = None, text
        else:
            d["prompt_tokens"], d["prompt"] = None, text
        return d

    def config(self) -> RunConfig:
        """The run the controls describe; :class:`ConfigError` naming the setting that is wrong."""
        d = self.state()
        if self.token_mode:
            d["prompt_tokens"], d["prompt"] = list(parse_token_ids(self.prompt.toPlainText())), None
        else:
            d["prompt"] = (d["prompt"] or "").strip()
            if not d["prompt"]:
                raise ConfigError("the prompt is empty: type a prompt or pick a built-in one", setting="prompt")
        if not d["target"]:
            raise ConfigError("no target model: pick a demo quantization or a model file", setting="target")
        refused = self.offers.refusal(d["target"], d["draft"], d["spec_type"])
        if refused:
            raise ConfigError(f"the draft model is refused: {refused}", setting="draft")
        return RunConfig.from_dict(d)

    def set_config(self, cfg: RunConfig) -> None:
        """Show exactly ``cfg`` (a saved trace's or a matrix cell's run)."""
        self.set_state(cfg.to_dict())

    def set_state(self, d: dict[str, Any]) -> None:
        """Show a :meth:`RunConfig.to_dict`-shaped dict; values the declarations refuse leave their control as is."""
        base = default_run()
        for k, v in d.items():
            if k == "engine" and isinstance(v, dict):
                base["engine"].update(v)
            elif k != "engine":
                base[k] = v
        self._base = base
        self._quiet = True
        try:
            blockers = [QSignalBlocker(w) for w in (self.engine, self.spec_type, self.prompt, self.prompt_choice)]
            name = base.get("backend")
            if isinstance(name, str) and name:
                if self.engine.findData(name) < 0:  # an engine this installation does not have: shown, not run
                    self.engine.addItem(name, name)
                self.engine.setCurrentIndex(self.engine.findData(name))
            for ctl in self.settings.values():
                src = base if ctl.cls is RunConfig else base["engine"]
                if ctl.name in src:
                    ctl.set_value(src[ctl.name])
            if isinstance(base.get("target"), str) and base["target"]:
                self.target.set_value(base["target"])
            if isinstance(base.get("draft"), str) and base["draft"]:
                self.draft.set_value(base["draft"])
            toks = base.get("prompt_tokens")
            if isinstance(toks, (list, tuple)) and toks:
                self.prompt.setPlainText(", ".join(str(t) for t in toks))
                self.prompt_choice.setCurrentIndex(self.prompt_choice.findData(TOKEN_IDS))
            elif isinstance(base.get("prompt"), str):
                self.prompt.setPlainText(base["prompt"])
                self.prompt_choice.setCurrentIndex(0)
                self._sync_prompt_choice()
            del blockers
            self._refresh_engine(keep=base.get("spec_type"), stick=True)
        finally:
            self._quiet = False
        self._show_repack_note()

    # -- the engine ---------------------------------------------------------------------------
    def engine_settings(self) -> EngineSettings | None:
        try:
            return EngineSettings.from_dict(self.state()["engine"])
        except SpecviewError:
            return None

    def check_engine(self) -> str | None:
        """Ask the chosen engine whether it can run here and which spec types it offers; return its problem."""
        self._refresh_engine(keep=self.spec_type.currentData())
        return self.engine_problem

    def _refresh_engine(self, keep: Any, *, stick: bool = False) -> None:
        """Model kind, engine-specific rows, the engine's problem and spec types; ``stick`` keeps ``keep`` offered."""
        name = self.backend_name()
        kind = backend_facts(name)[1]
        if kind != self.target.model_kind:
            for picker in (self.target, self.draft):
                picker.set_model_kind(kind)
            self.offers.refresh_targets()
        for n, ctl in self.settings.items():
            form, w = self._rows[n]
            on = ctl.applies_to(name)
            w.setVisible(on)
            label = form.labelForField(w)
            if label is not None:
                label.setVisible(on)
        for group, box in self._setting_boxes.items():
            box.setVisible(any(self.settings[n].applies_to(name) for n in self.settings
                               if (self.settings[n].field.metadata.get("group") or "engine") == group))
        self.engine_problem, types = probe_engine(name, self.engine_settings())
        if not types:  # an unusable engine still shows what the run would have used
            types = [keep] if isinstance(keep, str) and keep else []
        elif stick and isinstance(keep, str) and keep and keep not in types:
            types.append(keep)  # a saved run's spec type stays visible; the engine refuses it when run
        self.spec_types = types
        with QSignalBlocker(self.spec_type):
            self.spec_type.clear()
            for t in types:
                self.spec_type.addItem(SPEC_TYPE_WORDS.get(t, t), t)
            self.spec_type.setCurrentIndex(max(0, self.spec_type.findData(keep)))
        self._draft_for_spec_type()
        self.offers.refresh_draft(follow=not self._quiet)
        self.sigEngineChecked.emit(name, self.engine_problem)

    # -- changes ------------------------------------------------------------------------------
    def repack_reason(self) -> str:
        """The machine's reason for no repack shown under the engine settings ("" when the user chose, or none)."""
        on = "no_repack" in self.settings and self.settings["no_repack"].value() is True
        return decided(self._base, "no_repack") if on else ""

    def _show_repack_note(self) -> None:
        reason = self.repack_reason()
        self.repack_note.setText(reason)
        self.repack_note.setVisible(bool(reason))

    def _changed(self, name: str) -> None:
        ctl = self.settings.get(name)
        if not self._quiet and ctl is not None:  # the user's own choice from now on: no longer unset or decided
            (self._base if ctl.cls is RunConfig else self._base.setdefault("engine", {}))[name] = ctl.value()
            (self._base.get(DECIDED_KEY) or {}).pop(name, None)
        self._show_repack_note()
        if self._quiet:
            return
        if ctl is not None and ctl.field.metadata.get("only_for"):
            # an engine-specific setting (a binary, its flags) can change what the engine offers
            self._refresh_engine(keep=self.spec_type.currentData())
            if self.engine_problem is not None:
                return
        self.sigChanged.emit()

    def _engine_changed(self) -> None:
        if self._quiet:
            return
        self._refresh_engine(keep=self.spec_type.currentData())
        if self.engine_problem is None:
            self.sigChanged.emit()

    def _draft_for_spec_type(self) -> None:
        """The draft picker is live for the types that load a draft file; on the demo it follows the type.

        draft-eagle3, draft-dflash and draft-dspark each get the demo's tiny drafter of that type, and
        draft-simple the demo's Q4_0 copy, so switching the type never leaves a draft of the wrong kind.
        """
        st = self.spec_type.currentData()
        self.draft.setEnabled(st in DRAFT_FILE_TYPES)
        self._params_for_spec_type(st)
        if st not in DRAFT_FILE_TYPES or not is_demo_name(self.target.value() or DEMO_TARGET):
            return
        cur = self.draft.value()
        if cur and not is_demo_name(cur):
            return  # the user's own file stays
        want = DEMO_DRAFT if st == "draft-simple" else f"demo:{DEMO_DRAFTERS[st]}"
        if cur != want and (demo_drafter(cur) is not None or st != "draft-simple" or not cur):
            self.draft.set_value(want)

    def _params_for_spec_type(self, st: str | None) -> None:
        """The drafting settings are live only for the spec types that read them: n_max, n_min and p_min for the
        draft-model family (and a type only a server knows, which may), the n-gram sizes for ngram-simple; a
        greyed one says in its tooltip which types read it."""
        local = set(DRAFT_PARAM_TYPES) | {"ngram-simple", "none"}
        for name, live, readers in (
            *((n, st in DRAFT_PARAM_TYPES or st not in local, "the draft-model types")
              for n in ("n_max", "n_min", "p_min")),
            *((n, st == "ngram-simple", "ngram-simple") for n in ("ngram_size_n", "ngram_size_m")),
        ):
            ctl = self.settings.get(name)
            if ctl is None:
                continue
            ctl.widget.setEnabled(live)
            note = "" if live else f"\n(the {st} spec type does not read it; {readers} do)"
            ctl.widget.setToolTip(ctl.widget.toolTip().split("\n(the ")[0] + note)

    def _spec_type_changed(self) -> None:
        self._draft_for_spec_type()
        self.offers.refresh_draft(follow=not self._quiet)
        self._changed("spec_type")

    def _prompt_chosen(self, i: int) -> None:
        data = self.prompt_choice.itemData(i)
        if data == TOKEN_IDS:
            self.prompt.setPlaceholderText("token ids, e.g. 1, 270, 280")
            self._changed("prompt_tokens")
        elif data:
            self.prompt.setPlainText(data)

    def _sync_prompt_choice(self) -> None:
        if self.token_mode:
            return
        text = self.prompt.toPlainText().strip()
        idx = 0
        for i in range(self.prompt_choice.count()):
            data = self.prompt_choice.itemData(i)
            if data not in (None, TOKEN_IDS) and data == text:
                idx = i
        with QSignalBlocker(self.prompt_choice):
            self.prompt_choice.setCurrentIndex(idx)

    def _prompt_edited(self) -> None:
        self._sync_prompt_choice()
        if not self._quiet:
            self.sigPromptEdited.emit()


class ControlsPanel(QWidget):
    """The dock's contents: the run controls (scrolling), and below them, always in view, whether to
    re-run and diagnose, and Run / Cancel."""

    def __init__(self, prompts: dict[str, str], parent: QWidget | None = None):
        super().__init__(parent)
        panel = QWidget()
        lay = QVBoxLayout(panel)
        lay.setContentsMargins(6, 6, 6, 6)
        self.controls = RunControls(prompts)
        lay.addWidget(self.controls)
        lay.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setWidget(panel)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setMinimumWidth(max(panel.sizeHint().width(), panel.minimumSizeHint().width())
                                    + self.scroll.verticalScrollBar().sizeHint().width() + 8)
        box = QGroupBox("Run")
        rl = QVBoxLayout(box)
        self.auto_run = QCheckBox("re-run when a setting changes")
        self.auto_run.setObjectName("auto_run")
        self.auto_run.setToolTip("flip a control and see: runs again after a short pause, re-running only the "
                                 "arms the change invalidates")
        self.diagnose = QCheckBox("diagnose the fork")
        self.diagnose.setObjectName("diagnose")
        self.diagnose.setToolTip("after each run that forks, replay the fork to tell a near-tie from a state bug")
        rl.addWidget(self.auto_run)
        rl.addWidget(self.diagnose)
        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("run_button")
        self.run_button.setToolTip("run both arms (Ctrl+R, F5)")
        self.run_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancel_button")
        self.cancel_button.setToolTip("stop the run within one forward pass (Esc)")
        self.cancel_button.setEnabled(False)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        rl.addLayout(buttons)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addWidget(self.scroll, 1)
        run = QWidget()
        run_lay = QVBoxLayout(run)
        run_lay.setContentsMargins(6, 2, 6, 6)
        run_lay.addWidget(box)
        outer.addWidget(run)
