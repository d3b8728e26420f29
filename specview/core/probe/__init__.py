"""The probe: the known triggers of real rollback and state bugs, each a scripted scenario with its control.

scenarios (the triggers and the scripted drafter), runner (the in-process half, a job), neighbour (a second
sequence in-process), server (the llama-server half, through the registry's runner), result (one row per
trigger and engine, the report), text (the table and the Markdown report).
"""

from .result import IDENTICAL, NEAR_TIE, RESULTS, SCHEMA, STATE, UNPROVEN, ProbeReport, TriggerResult
from .scenarios import NAMES, TRIGGERS

__all__ = ["IDENTICAL", "NEAR_TIE", "NAMES", "RESULTS", "SCHEMA", "STATE", "TRIGGERS", "UNPROVEN", "ProbeReport",
           "TriggerResult"]
