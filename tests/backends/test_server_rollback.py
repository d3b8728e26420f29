"""llama-server picks its own rollback for a hybrid target and has no flag to change it: ``--rollback`` other
than auto is refused there, naming what the server does and the engine that takes it."""

from __future__ import annotations

import pytest

from specview.core.config import EngineSettings, RunConfig
from specview.core.errors import ConfigError
from specview.core.registry import get_backend

from test_server import find_binary


@pytest.mark.parametrize("mode", ["snapshots", "checkpoint", "seq-rm"])
def test_an_explicit_rollback_is_refused_before_a_server_starts(mode):
    cfg = RunConfig(prompt="x", backend="llama-server", spec_type="ngram-simple",
                    engine=EngineSettings(rollback=mode, server_bin=find_binary()))
    with pytest.raises(ConfigError) as exc:
        get_backend("llama-server").check(cfg)
    assert exc.value.setting == "rollback"
    assert f"rollback {mode}: llama-server picks its own" in str(exc.value) and "--engine llama.cpp" in str(exc.value)


@pytest.mark.parametrize("mode", [None, "auto"])
def test_auto_is_the_servers_own_choice(mode):
    cfg = RunConfig(prompt="x", backend="llama-server", spec_type="ngram-simple",
                    engine=EngineSettings(rollback=mode, server_bin=find_binary()))
    get_backend("llama-server").check(cfg)
