"""``sts demo --out`` never deletes what the demo did not write."""

from __future__ import annotations

from pathlib import Path

import pytest

from sts_harness.demo import MARKER, DemoOptions, prepare_out


def test_a_folder_with_user_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "thesis.txt").write_text("years of work")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.csv").write_text("a,b")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="not written by sts demo"):
            prepare_out(tmp_path, overwrite=overwrite)
    assert (tmp_path / "thesis.txt").read_text() == "years of work"
    assert (tmp_path / "sub" / "data.csv").exists()


def test_an_earlier_demo_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    prepare_out(out, overwrite=False)  # new folder
    assert (out / MARKER).exists()
    (out / "tables").mkdir()
    (out / "tables" / "x").write_text("old")
    (out / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare_out(out, overwrite=False)
    prepare_out(out, overwrite=True)
    assert not (out / "tables").exists()
    assert (out / "notes.md").read_text() == "mine"  # only the demo's own outputs go


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        prepare_out(tmp_path / "f", overwrite=True)


@pytest.mark.parametrize("field,value", [("rate", -1.0), ("rate", 0.0), ("duration", 0.0),
                                          ("max_tokens", 0)])
def test_bad_demo_options_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        DemoOptions(**{field: value})
