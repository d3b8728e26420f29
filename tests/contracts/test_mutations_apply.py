"""Every planted defect of ``scripts/mutation-check.py`` still applies to the tree, and names tests that exist.

The mutation check runs after the suite; a patch whose text the code no longer
contains is reported there as stale and fails CI at its very end.  This catches
it in the suite, in a second: each mutation's text is found exactly once in its
file, and each test it names is a file (and function) of the tests.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutations():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation-check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.MUTATIONS


MUTATIONS = _mutations()


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_a_planted_defect_still_applies_and_names_real_tests(m):
    text = (ROOT / m.path).read_text(encoding="utf-8")
    assert text.count(m.old) == 1, f"{m.path}: the mutation's text is found {text.count(m.old)} times"
    assert m.new != m.old and m.tests
    for t in m.tests:
        file, _, name = t.partition("::")
        src = (ROOT / file).read_text(encoding="utf-8")
        if name:
            func = re.sub(r"\[.*\]$", "", name)
            assert re.search(rf"^def {re.escape(func)}\(", src, re.M), f"{t}: no such test"
