"""The checks before a run starts: the form must describe a run this machine can start, and say what is wrong.

The window asks here before it submits anything to the model worker, so a bad form is refused in the
verdict bar, naming the setting, before a model loads:

* :func:`form_config`: the run the controls describe.  :meth:`RunControls.config
  <specview.gui.controls.RunControls.config>` refuses an empty prompt, no target model and a draft whose
  header does not fit the target (another vocabulary, say); here a spec type the target's header says it
  cannot run is refused too (draft-mtp on a target with no MTP heads).
* :func:`focus_setting`: the control of the setting a refusal names takes the focus.
* :func:`engine_refusal`: a run (a matrix cell's, say) whose engine cannot run here.
* :func:`engine_notice`: what the verdict bar and the status line say once the chosen engine has been asked
  whether it runs here.
* :func:`trace_run`: a saved trace's run, or why it cannot be run again here.
* :func:`in_app_words`: an engine's message, which names settings by their command-line flags, with each
  flag the form has a control for named by that control.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.config import LLAMA_SPEC_TYPES, EngineSettings, RunConfig, declared
from ..core.registry import backend_names
from ..core.errors import ConfigError, SpecviewError
from .controls import engine_problem, run_of_trace

if TYPE_CHECKING:
    from .controls import RunControls

#: the words of the verdict bar's warning that the chosen engine cannot run here
ENGINE_UNAVAILABLE = "engine is not available"


#: the controls of the settings that declare no label of their own
_CONTROL_OF = {"target": "Target", "draft": "Draft model", "spec_type": "Drafter", "backend": "Engine",
               "prompt": "Prompt", "prompt_tokens": "Prompt"}


def _flag_controls() -> dict[str, str]:
    """Every long flag (``--n-ctx``) of a setting the form shows, to the label of its control."""
    out: dict[str, str] = {}
    for cls in (RunConfig, EngineSettings):
        for f in declared(cls):
            label = f.metadata.get("label") if f.metadata.get("gui", True) else ""
            label = label or _CONTROL_OF.get(f.name, "")
            for flag in f.metadata.get("flags", ()):
                if label and flag.startswith("--"):
                    out[flag] = label
    return out


def _flag_pattern() -> re.Pattern[str]:
    """A long flag, with the value after it when that is an engine's name or a spec type ("--engine llama-server")."""
    values = sorted({*backend_names(), *LLAMA_SPEC_TYPES}, key=len, reverse=True)  # the longest name first
    return re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?![\w-])( (?:" + "|".join(map(re.escape, values))
                      + r")(?![\w.-]))?")


def _named(m: re.Match[str], controls: dict[str, str]) -> str:
    flag, value = m.group(1), m.group(2)
    if flag not in controls:
        return m.group(0)
    label = f"<b>{html.escape(controls[flag])}</b>"
    return f"{label}:{value}" if value else label  # "--engine llama-server": "Engine: llama-server"


def in_app_words(message: str) -> str:
    """``message`` as HTML for the verdict bar: a command-line flag the form has a control for ("Raise --n-ctx to
    at least 461") is named by that control's label in bold ("Raise **Context** to at least 461"), except inside
    a quoted command (between backticks), which stays as it is written."""
    controls, flag = _flag_controls(), _flag_pattern()
    parts = html.escape(message).split("`")
    for i in range(0, len(parts), 2):  # the text outside backticks
        parts[i] = flag.sub(lambda m: _named(m, controls), parts[i])
    return "`".join(parts)


def form_config(controls: RunControls) -> RunConfig:
    """The run ``controls`` describe; :class:`ConfigError` naming a bad value (or a spec type the target's header
    says it cannot run: checked before anything loads)."""
    cfg = controls.config()
    why = controls.offers.spec_refusal(cfg.target, cfg.spec_type)
    if why:
        raise ConfigError(why, setting="spec_type")
    return cfg


def focus_setting(controls: RunControls, exc: SpecviewError) -> bool:
    """Give the focus to the control of the setting ``exc`` names; False when it names none the form has."""
    setting = exc.setting if isinstance(exc, ConfigError) else None
    if setting not in controls.settings:
        return False
    controls[setting].setFocus()
    return True


def engine_refusal(cfg: RunConfig) -> str | None:
    """Why ``cfg``'s engine cannot run here, as the error a run shows; None when it can."""
    problem = engine_problem(cfg.backend, cfg.engine)
    return None if problem is None else f"the {cfg.backend} {ENGINE_UNAVAILABLE}: {problem}"


class EngineNotice(NamedTuple):
    """What to say once the chosen engine was asked whether it runs here."""

    verdict: tuple[str, str] | None  # (HTML, kind) for the verdict bar, or None: leave it as it is
    status: str  # the status line


def engine_notice(name: str, problem: str | None, shown_kind: str, shown_text: str) -> EngineNotice:
    """The verdict bar's warning when the engine ``name`` cannot run here (with where to choose another), and
    its all-clear when it can again while that warning (``shown_kind``, ``shown_text``) is still on screen."""
    if problem is None:
        ready = shown_kind == "warn" and ENGINE_UNAVAILABLE in shown_text
        return EngineNotice((f"Engine {html.escape(name)} ready. Press Run (Ctrl+R / F5).", "info") if ready
                            else None, f"engine {name}")
    return EngineNotice((f"<b>The {html.escape(name)} {ENGINE_UNAVAILABLE}</b>: {html.escape(problem)}"
                         "<br>Choose another engine in Models ▸ Engine to run here.", "warn"),
                        f"{name} unavailable: {problem}")


def trace_run(trace: Any) -> tuple[RunConfig | None, str | None]:
    """(the run a saved trace records, None) or (None, why its settings cannot be run again here)."""
    try:
        return run_of_trace(trace), None
    except SpecviewError as exc:
        return None, f"the trace's settings cannot be run again here ({exc}); the controls keep theirs"
