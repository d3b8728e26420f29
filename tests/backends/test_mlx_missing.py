"""Without MLX, or on a platform MLX does not support, the MLX engine says why.

These tests need no MLX: they hide it (or fake the platform) and check that
importing the backend module still works and that constructing the backend
raises BackendUnavailable with the reason a user can act on.
"""

from __future__ import annotations

import importlib
import sys

import pytest
from require import require_module

from specview.core import registry
from specview.core.engine import BackendUnavailable


@pytest.fixture
def fresh_mlx_module(monkeypatch):
    """specview.backends.mlx (the package and its modules) imported anew, so no state from
    earlier imports helps it.

    The sys.modules entries and the package attribute are put back afterwards,
    so later tests see the modules (and the classes) they imported."""
    import specview.backends as pkg

    for name in [m for m in sys.modules if m == "specview.backends.mlx" or m.startswith("specview.backends.mlx.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(pkg, "mlx", getattr(pkg, "mlx", None), raising=False)
    return lambda: importlib.import_module("specview.backends.mlx")


def hide(monkeypatch, *names):
    for name in names:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError


def test_mlx_not_installed(monkeypatch, fresh_mlx_module):
    hide(monkeypatch, "mlx", "mlx_lm")
    monkeypatch.setattr(sys, "platform", "linux")
    mod = fresh_mlx_module()  # importing the module never needs mlx
    with pytest.raises(BackendUnavailable) as err:
        mod.MLXBackend()
    msg = str(err.value)
    assert "MLX is not usable here" in msg
    # the command in backticks is one a user can paste as it is
    assert msg.endswith("Install it with `pip install 'specview[mlx]'` (on Linux it installs mlx[cpu])."), msg


def test_mlx_lm_not_installed(monkeypatch, fresh_mlx_module):
    require_module("mlx.core")
    hide(monkeypatch, "mlx_lm")
    mod = fresh_mlx_module()
    with pytest.raises(BackendUnavailable, match=r"mlx-lm is not usable here.*pip install 'specview\[mlx\]'"):
        mod.MLXBackend()


def test_through_the_registry(monkeypatch, fresh_mlx_module):
    hide(monkeypatch, "mlx", "mlx_lm")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(registry, "_INSTANCES", {})
    with pytest.raises(BackendUnavailable, match="specview\\[mlx\\]"):
        registry.get_backend("mlx")


@pytest.mark.parametrize("plat, machine, why", [
    ("win32", "AMD64", "does not run on Windows"),
    ("darwin", "x86_64", "only on Apple silicon"),
])
def test_unsupported_platform(monkeypatch, fresh_mlx_module, plat, machine, why):
    mod = fresh_mlx_module()
    monkeypatch.setattr(sys, "platform", plat)
    monkeypatch.setattr(mod.lib.platform, "machine", lambda: machine)
    with pytest.raises(BackendUnavailable, match=why):
        mod.MLXBackend()
