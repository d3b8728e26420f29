"""What every tiny drafter writer shares: a seed fixes the bytes, and a failed write leaves nothing behind.

``write_drafter`` writes each spec type's drafter (EAGLE-3, DFlash, DSpark) for
the demo target; the header checks against llama.cpp's loaders and the runs on
a real llama-server are in ``test_server_eagle3.py`` and ``test_server_dflash.py``.
"""

from __future__ import annotations

import pytest

from specview.backends.llama_cpp.tiny_drafters import WRITERS, common, write_drafter

pytestmark = [pytest.mark.demo]


@pytest.fixture(scope="module")
def facts() -> common.TargetFacts:
    from specview.backends.llama_cpp.demo import resolve

    return common.read_target(resolve("demo:Q8_0"))  # read once (a second or two): every writer takes it


@pytest.mark.parametrize("spec_type", list(WRITERS))
def test_a_seed_fixes_the_bytes_and_a_failed_write_leaves_the_old_file(facts, spec_type, tmp_path, monkeypatch):
    import gguf

    one = write_drafter(spec_type, facts, tmp_path / "one.gguf", seed=0)
    again = write_drafter(spec_type, facts.path, tmp_path / "again.gguf", seed=0)  # from the path, read anew
    other = write_drafter(spec_type, facts, tmp_path / "other.gguf", seed=1)
    assert again.read_bytes() == one.read_bytes()
    assert other.read_bytes() != one.read_bytes() and other.stat().st_size == one.stat().st_size

    # the header and metadata reach the disk, then writing the tensors fails
    def full_disk(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    out = tmp_path / "broken" / f"tiny-{spec_type}.gguf"
    with pytest.raises(OSError, match="No space left"):
        write_drafter(spec_type, facts, out)
    assert list(out.parent.iterdir()) == []  # neither the model nor a part of it
    out.write_bytes(b"an older drafter")
    with pytest.raises(OSError, match="No space left"):
        write_drafter(spec_type, facts, out)
    assert list(out.parent.iterdir()) == [out] and out.read_bytes() == b"an older drafter"


def test_an_unknown_spec_type_or_an_unreadable_target_is_named(tmp_path):
    with pytest.raises(ValueError, match="no tiny drafter for draft-mtp; there are draft-eagle3, draft-dflash"):
        write_drafter("draft-mtp", tmp_path / "t.gguf", tmp_path / "d.gguf")
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a GGUF file at all")
    from specview.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match=f"{bad}: cannot read it as a GGUF file"):
        write_drafter("draft-eagle3", bad, tmp_path / "d.gguf")
    assert not (tmp_path / "d.gguf").exists()
