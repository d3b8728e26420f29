"""The Probe tab: the known triggers of real rollback and state bugs, one row per trigger and engine."""

from .tab import TAB_TIP, ProbeTab, is_probe_file

__all__ = ["ProbeTab", "TAB_TIP", "is_probe_file"]
