"""Skips that CI turns into failures.

A test whose prerequisite is absent (a llama-server build, the desktop bundle, a Vulkan build, MLX, an X
server to open a real window on)
skips on a developer's machine and says how to get it.  CI sets a switch for each prerequisite it
provides (``SPECVIEW_REQUIRE_SERVER=1`` and so on); there the same absence is a failure, so a CI run
never passes a test that did not run.  Every conditional skip of the suite goes through here.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

#: CI's switches: each turns the absence of one prerequisite from a skip into a failure
SWITCHES = ("SPECVIEW_REQUIRE_SERVER", "SPECVIEW_REQUIRE_BUNDLE", "SPECVIEW_REQUIRE_VULKAN", "SPECVIEW_REQUIRE_MLX",
            "SPECVIEW_REQUIRE_X11")


def required(switch: str) -> bool:
    """Whether ``$switch=1`` says the prerequisite must be present."""
    assert switch in SWITCHES, switch
    return os.environ.get(switch) == "1"


def missing(reason: str, *, switch: str) -> NoReturn:
    """Skip the test because a prerequisite is absent, or fail it where ``$switch=1``."""
    if required(switch):
        pytest.fail(f"{switch}=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, *, switch: str = "SPECVIEW_REQUIRE_MLX") -> ModuleType:
    """``pytest.importorskip(name)``, except that it fails where ``$switch=1``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} is not importable ({exc}): pip install 'specview[mlx]'", switch=switch)
