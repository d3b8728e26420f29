"""Every llama.cpp model a test or a benchmark loads, and every context it opens, goes through ``tests/door.py``.

A model loaded past the door misses this machine's decisions (no repack where
the crash probe crashed, the AMX bug) and takes its pytest lane down on a CPU
whose repacked kernels crash.  This contract reads every ``.py`` file under
``tests/`` and ``bench/`` as Python (its syntax tree: a name in a comment or a
string is not a call) and fails, naming ``file:line``, on any call that builds a
``llama_cpp.Llama``, a ``LlamaModel``, a ``LlamaContext``, a ``LlamaEngine``, an
``ObservedEngine``, a ``ModelStore`` or a ``vocab_model``, or calls
``llama_model_load_*``, ``llama_init_from_model`` or
``llama_new_context_with_model``, outside the door.  A name imported under
another name (``from ... import LlamaModel as M``) is followed, and so is
``getattr(ll, "llama_model_load_from_file")(...)``.  A subclass (a test's own
engine that a backend's ``new_engine`` builds on decided settings) is not a call
of these names and is not refused.

Besides the door, a file may build them only where it must (``ALLOWED``, each
with its reason), and there only on a line marked ``# noqa: door - <why>``, so
a new site in an allowed file is still refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")

#: constructors that load weights or open a context on them (``vocab_model`` reads no weights, but it is a load
#: too, and the door has it: ``door.model(path, vocab_only=True)``)
CONSTRUCTORS = frozenset({"Llama", "LlamaModel", "LlamaContext", "LlamaEngine", "ObservedEngine", "ModelStore",
                          "vocab_model"})
#: llama.cpp's C API calls that load a model or make a context
C_CALLS = frozenset({"llama_init_from_model", "llama_new_context_with_model"})
C_PREFIXES = ("llama_model_load",)

#: files besides the door that may build them, each with its reason, on lines marked ``MARK``; kept to a minimum
ALLOWED = {
    "tests/backends/test_planted_crash.py": "the refusal's own test: a load with repacking on must be refused "
                                            "under the planted crash, and one without it must load",
}
DOOR = "tests/door.py"
MARK = "noqa: door"


def forbidden(name: str) -> bool:
    return name in CONSTRUCTORS or name in C_CALLS or name.startswith(C_PREFIXES)


def _called_name(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """The forbidden name ``func`` calls (through an import alias or a ``getattr`` with a constant), or None."""
    if isinstance(func, ast.Name):
        name = aliases.get(func.id, func.id)
    elif isinstance(func, ast.Attribute):
        name = func.attr
    elif (isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr"
          and len(func.args) >= 2 and isinstance(func.args[1], ast.Constant) and isinstance(func.args[1].value, str)):
        name = func.args[1].value
    else:
        return None
    return name if forbidden(name) else None


def constructions(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, name) of every forbidden construction or call in ``source``; a file that does not parse raises."""
    tree = ast.parse(source, filename=filename)
    aliases = {a.asname: a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.asname and forbidden(a.name)}
    found = [(node.lineno, name) for node in ast.walk(tree) if isinstance(node, ast.Call)
             for name in [_called_name(node.func, aliases)] if name]
    return sorted(found)


def scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_or_benchmark_loads_a_model_past_the_door() -> None:
    files = scanned_files()
    assert len(files) > 50  # the tree really was read: tests/ alone has well over fifty modules
    bad = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == DOOR:
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for line, name in constructions(source, rel):
            if rel in ALLOWED and MARK in lines[line - 1]:
                continue
            bad.append(f"{rel}:{line}: {name}(...)")
    assert not bad, ("llama.cpp loads or contexts built past tests/door.py (use door.model / door.context / "
                     "door.store / door.llama / door.c_load / door.c_context):\n  " + "\n  ".join(bad))


def test_every_allowed_file_exists_has_a_reason_and_still_needs_its_place() -> None:
    for rel, why in ALLOWED.items():
        assert (ROOT / rel).is_file(), rel
        assert why.strip(), rel
        assert constructions((ROOT / rel).read_text(encoding="utf-8"), rel), f"{rel} builds nothing: unlist it"


def test_the_checker_catches_a_bare_llama() -> None:
    """The contract can fail: a source that builds ``llama_cpp.Llama("x.gguf")`` is caught, on its line."""
    src = "import llama_cpp\n\n\nref = llama_cpp.Llama(\"x.gguf\")\n"
    assert constructions(src) == [(4, "Llama")]


def test_the_checker_follows_aliases_and_getattr_and_ignores_comments_and_strings() -> None:
    src = ("from specview.backends.llama_cpp.model import LlamaModel as M\n"
           "import llama_cpp as ll\n"
           "# llama_cpp.Llama('in a comment') and LlamaModel(p) do not count\n"
           "doc = \"LlamaEngine(m, s) in a string does not count\"\n"
           "m = M('t.gguf')\n"
           "c = ll.llama_model_load_from_file(b'x', ll.llama_model_default_params())\n"
           "x = getattr(ll, 'llama_init_from_model')(c, None)\n"
           "class Mine(LlamaEngine):\n"
           "    pass\n")
    assert constructions(src) == [(5, "LlamaModel"), (6, "llama_model_load_from_file"), (7, "llama_init_from_model")]


def test_the_door_itself_is_seen_building_what_it_builds() -> None:
    """The checker reads the real files as it reads the strings above: the door's own sites are all found."""
    names = {name for _, name in constructions((ROOT / "tests/door.py").read_text(encoding="utf-8"))}
    assert {"Llama", "LlamaModel", "LlamaEngine", "ObservedEngine", "ModelStore", "vocab_model",
            "llama_model_load_from_file", "llama_init_from_model"} <= names
