"""benchmarks/RESULTS.md: its tables are what ``benchmarks.results_page`` makes of the
results' JSON, the check notices a figure that changed, and the page stays short."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import results_page
from benchmarks.results_page import PAGE, RESULTS, TABLES, main, refresh

#: The page is what holds today, not a log: a screenful per claim.
MAX_LINES = 260


def test_the_pages_tables_are_what_the_json_gives() -> None:
    _, stale = refresh(PAGE.read_text(encoding="utf-8"))
    assert not stale, (f"benchmarks/RESULTS.md: tables {stale} differ from their JSON; run "
                       "`python -m benchmarks.results_page`")


def test_the_page_stays_short() -> None:
    lines = PAGE.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"benchmarks/RESULTS.md has {lines} lines (at most {MAX_LINES})"


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    """The page and every JSON its tables read, under ``tmp_path``."""
    page = tmp_path / "RESULTS.md"
    shutil.copy(PAGE, page)
    for rel in {p for source in TABLES.values() for p in source.paths}:
        (tmp_path / "results" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS / rel, tmp_path / "results" / rel)
    return page, tmp_path / "results"


def test_the_check_names_the_table_whose_figure_changed(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    page, results = _copy(tmp_path)
    args = ["--page", str(page), "--results", str(results)]
    trace = results / "trace-seed-scale" / "bench.json"
    doc = json.loads(trace.read_text(encoding="utf-8"))
    engine = next(r for r in doc["runs"] if r["scheme"] == "engine")
    engine["goodput"] = 0.25  # as a new run of the same shape would
    trace.write_text(json.dumps(doc), encoding="utf-8")
    before = page.read_text(encoding="utf-8")

    assert main(["--check", *args]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "stale: table 'real-traffic' (from trace-seed-scale/bench.json)"]
    assert page.read_text(encoding="utf-8") == before  # --check changes nothing

    assert main(args) == 0
    after = page.read_text(encoding="utf-8")
    assert "| engine alone | 25.0 % (1.00x) |" in after
    assert main(["--check", *args]) == 0
    # Only the block changed: the prose around it is the same line for line.
    outside = results_page.BLOCK.sub("", before), results_page.BLOCK.sub("", after)
    assert outside[0] == outside[1]


def test_a_block_for_an_unknown_table_is_refused(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8") + "\n<!-- table: nowhere -->\n<!-- /table -->\n"
    with pytest.raises(ValueError, match="nowhere"):
        refresh(text)
