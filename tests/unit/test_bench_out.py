"""``sts bench`` replaces only its own scratch folder inside ``--out``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench import BenchOptions, run_bench
from sidecar import ConfigError


def test_a_work_folder_the_bench_did_not_make_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"was not made by sts bench; .* \(--out\)$"):
        run_bench(BenchOptions(profile="cpu-small", engine="simulated", rates=[1.0],
                               duration_s=1.0, schemes=["engine"], out=str(tmp_path)))
    assert (tmp_path / "work" / "notes.txt").read_text() == "mine"
