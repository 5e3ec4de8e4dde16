"""Smoke test of the gateway overhead micro-benchmark (a real sidecar, simulated engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gateway_overhead import main, run

_LATENCY_KEYS = ("ack_rtt_ms", "send_to_received_ms", "received_to_finish_ms",
                 "finish_to_visible_ms", "send_to_visible_ms")


@pytest.mark.timeout(timeout=90, method="thread")
def test_gateway_overhead_smoke(tmp_path: Path) -> None:
    out = tmp_path / "gateway_overhead.json"
    # 16 twice: the second window is new work again (ids unique per window; a replayed
    # id would be acknowledged as a duplicate, and the run refuses to count those).
    result = run(1.0, [1, 16, 16], 1, out, latency_samples=50)

    assert out.exists()
    written = json.loads(out.read_text())
    assert written["throughput"] == result["throughput"]
    assert written["machine"]["cpu_count"] >= 1
    assert written["settings"]["batch_sizes"] == [1, 16, 16]
    assert written["settings"]["event_loop"] == "auto"

    assert [r["batch_size"] for r in written["throughput"]] == [1, 16, 16]
    rows = {r["batch_size"]: r for r in written["throughput"]}
    for row in written["throughput"]:
        assert row["submissions_per_s"] > 0
        assert row["rpcs_per_s"] > 0
        assert row["refused"] == {}
        # Every accepted request is new work: it finished in the window or was left over.
        done = row["completed_per_s"] * row["wall_s"] + row["backlog_at_end"]
        assert done >= 0.95 * row["accepted"], row
        assert 0 < row["ack_ms_per_rpc"]["p50"] <= row["ack_ms_per_rpc"]["p99"]
        cpu_us = row["sidecar_cpu_us_per_request"]  # None only where /proc is missing
        assert cpu_us is None or cpu_us > 0, row
    assert rows[16]["submissions_per_s"] > rows[1]["submissions_per_s"], rows

    lat = written["added_latency"]
    assert lat["statuses"] == {"ok": 50}
    assert lat["visible_samples"] == 50
    for key in _LATENCY_KEYS:
        for stat in ("mean", "p50", "p99", "max"):
            assert lat[key][stat] is not None and lat[key][stat] >= 0, (key, lat[key])


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batch-sizes", "0", "--out", "/nonexistent/x.json"]) == 1
    assert "batch_sizes" in capsys.readouterr().err
