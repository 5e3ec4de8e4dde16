"""Production traces (``sts_capacity.trace``) and ``sts plan --trace``: the order, gaps and
lengths of a trace kept (and scaled), malformed rows named by their line, the figures
capacity planning reads. The traces are written by the tests, but for the last test,
which checks the shipped trace's figures as its README gives them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sts_capacity.plan import add_plan_arguments, run_plan
from sts_capacity.trace import Trace, TraceRequest, read_trace
from tests.utils import REPO

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _csv(tmp_path: Path, rows: list[str], name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def test_a_csv_trace_keeps_its_order_gaps_and_lengths(tmp_path: Path) -> None:
    path = _csv(tmp_path, ["2024-01-02 10:00:00.0000000,500,7",
                           "2024-01-02 10:00:00.2500000,20,300",
                           "2024-01-02 10:00:03.2500090,1000,1",
                           "2024-01-02 10:00:03.2500090,3,4"])
    trace = read_trace(path)
    assert trace.name == "t"
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 500, 7), (0.25, 20, 300), (3.250009, 1000, 1), (3.250009, 3, 4)]
    # scaled: the gaps divided, the lengths and the order as they were
    fast = trace.scaled(speedup=2)
    assert [r.arrival_s for r in fast.requests] == pytest.approx([0, 0.125, 1.6250045,
                                                                  1.6250045])
    assert [r.output_tokens for r in fast.requests] == [7, 300, 1, 4]
    at_rate = trace.scaled(rate=10)
    assert at_rate.mean_rate == pytest.approx(10)
    assert at_rate.requests[1].arrival_s / at_rate.requests[2].arrival_s == pytest.approx(
        0.25 / 3.250009)
    cut = trace.window(0.2, 3)
    assert [(r.arrival_s, r.output_tokens) for r in cut.requests] == [(pytest.approx(0.05), 300)]


def test_a_jsonl_trace_carries_priorities_and_budgets_and_is_put_in_order(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"arrival_s": 12.5, "input_tokens": 10, "output_tokens": 5, "priority": "high"},
        {"arrival_s": 10.0, "input_tokens": 20, "output_tokens": 6, "max_tokens": 64},
        {"arrival_s": 12.5, "input_tokens": 30, "output_tokens": 7}]) + "\n\n")
    trace = read_trace(path)
    assert [(r.arrival_s, r.input_tokens, r.priority, r.max_tokens) for r in trace.requests] == [
        (0.0, 20, None, 64), (2.5, 10, "high", None), (2.5, 30, None, None)]


@pytest.mark.parametrize(("rows", "error"), [
    (["2024-01-02 10:00:00,5,5", "yesterday,5,5"], "t.csv:3: not a time: 'yesterday'"),
    (["2024-01-02 10:00:00,5,5", "2024-01-02 10:00:01,-1,5"],
     "t.csv:3: ContextTokens must be an integer >= 0, got '-1'"),
    (["2024-01-02 10:00:00,5,many"], "t.csv:2: GeneratedTokens must be an integer >= 0, "
                                     "got 'many'"),
])
def test_a_malformed_csv_row_is_one_line_naming_it(tmp_path: Path, rows, error) -> None:
    with pytest.raises(ValueError) as e:
        read_trace(_csv(tmp_path, rows))
    assert str(e.value) == f"{tmp_path / error.split(':')[0]}:{error.split(':', 1)[1]}"
    assert "\n" not in str(e.value)


def test_a_malformed_jsonl_row_or_header_is_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 1, "input_tokens": 1, "output_tokens": 1}\n{nope\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_trace(bad)
    bad.write_text('{"arrival_s": 1, "input_tokens": 1, "output_tokens": 1, '
                   '"priority": "urgent"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: priority must be one of high, "
                                         r"normal, low, got 'urgent'"):
        read_trace(bad)
    header = tmp_path / "other.csv"
    header.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(ValueError, match=r"other.csv:1: the header lacks TIMESTAMP, "
                                         r"ContextTokens, GeneratedTokens"):
        read_trace(header)


def test_the_figures_of_a_bursty_trace() -> None:
    """A burst of 30 in one second on a background of one a second: the peak and the
    burst are what planning reads, not only the mean."""
    background = [TraceRequest(float(s), 100, 10) for s in range(120)]
    burst = [TraceRequest(50 + i / 30, 100, 100) for i in range(30)]
    trace = Trace("b", tuple(sorted(background + burst, key=lambda r: r.arrival_s)))
    f = trace.figures()
    assert f.requests == 150 and f.duration_s == 119
    assert f.max_per_second == 31
    assert f.peak_rate == pytest.approx(90 / 60)
    assert f.output_tokens["p50"] == 10 and f.output_tokens["max"] == 100
    assert f.output_tokens["mean"] == pytest.approx((120 * 10 + 30 * 100) / 150)


def _plan(argv: list[str], capsys) -> tuple[int, str, str]:
    args = add_plan_arguments(argparse.ArgumentParser()).parse_args(argv)
    rc = run_plan(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sts_plan_sizes_a_fleet_for_a_traces_peak(tmp_path: Path, capsys) -> None:
    rows = [f"2024-01-02 10:00:{s:02d}.0,1000,{50 if s < 30 else 10}" for s in range(60)]
    path = _csv(tmp_path, rows)
    rc, out, err = _plan(["--trace", str(path), "--trace-rate", "100",
                          "--tokens-per-s", "1000", "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["trace"]["mean_rate"] == pytest.approx(100)
    assert doc["plan"]["mean_output_tokens"] == pytest.approx(30)
    assert doc["plan"]["gpus"] >= 1 and doc["plan"]["profile"] == "trace t"
    rc, out, err = _plan(["--trace", str(path)], capsys)
    assert rc == 0 and out.startswith("Trace t: 60 requests") and "GPUs:" in out
    rc, out, err = _plan(["--profile", "seed-200qps", "--trace-rate", "5"], capsys)
    assert (rc, err.strip()) == (2, "sts: --trace-rate needs --trace (sts plan)")
    rc, out, err = _plan(["--trace", str(tmp_path / "none.csv")], capsys)
    assert rc == 2 and "none.csv" in err and "\n" not in err.strip()


def test_the_shipped_trace_has_the_figures_its_readme_gives() -> None:
    f = read_trace(REPO / "benchmarks" / "traces" / "azure-llm-inference-2023-code.csv").figures()
    assert (f.requests, round(f.duration_s), round(f.mean_rate, 2)) == (8819, 3436, 2.57)
    assert (round(f.peak_rate, 1), f.max_per_second) == (12.1, 67)
    assert [round(f.output_tokens[k]) for k in ("p50", "p90", "p99", "mean", "max")] == [
        13, 55, 251, 28, 1899]
    assert [round(f.input_tokens[k]) for k in ("p50", "p90", "p99", "mean")] == [
        1469, 5188, 7436, 2048]
    readme = (REPO / "benchmarks" / "traces" / "README.md").read_text()
    assert "CC BY 4.0" in readme and "Splitwise" in readme
