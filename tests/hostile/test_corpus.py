"""The hostile-input corpus: every kind of file specview reads, thrown at its reader in a child whose time and
memory are bounded (``bounded.py``; the properties are in ``corpus_files.py``)."""

from __future__ import annotations

import pytest

import bounded


@pytest.mark.parametrize("kind", ["traces", "suites", "quality_results", "matrices", "matrix_specs"])
def test_hostile_files_are_read_or_refused_within_bounds(kind):
    bounded.run(f"corpus_files:{kind}")


@pytest.mark.parametrize("kind", ["gguf_headers", "store_manifests", "store_fifos"])
def test_hostile_model_files_are_read_or_skipped_within_bounds(kind):
    """GGUF headers and the files model stores keep (ollama manifests, the hub's refs, LM Studio's settings, an
    MLX config.json, specview's own folders file and header cache), through specview.core.models' public
    functions."""
    pytest.importorskip("gguf")  # tests/models/stores.py writes the headers with it
    bounded.run(f"corpus_files:{kind}")


def test_the_bounds_hold():
    """The child really is bounded: an allocation past its memory fails, and an input past its deadline too."""
    with pytest.raises(AssertionError, match="MemoryError"):
        bounded.run("corpus_checks:allocate")
    with pytest.raises(AssertionError, match="Overran: the reader ran past"):
        bounded.run("corpus_checks:hang")


def test_a_lone_surrogate_is_written_as_its_escape(tmp_path):
    # a trace's "a\ud800b" (a JSON escape UTF-8 cannot encode) in a model's architecture ended the HTML report
    # in UnicodeEncodeError; every file specview writes goes through write_atomic
    import json

    from specview.core.jsonfile import write_atomic

    p = write_atomic(tmp_path / "x.json", json.dumps({"arch": "a\ud800b"}, ensure_ascii=False))
    assert p.read_bytes() == b'{"arch": "a\\ud800b"}' and json.loads(p.read_text(encoding="utf-8")) == {"arch": "a\ud800b"}
    page = write_atomic(tmp_path / "r.html", "<td>a\ud800b</td>")
    assert page.read_text(encoding="utf-8") == "<td>a\\ud800b</td>"
