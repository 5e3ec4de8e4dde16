"""The shipped dashboard and alert rules are well-formed (what Grafana's import and
Prometheus' rule loader need); tests/process/test_monitoring.py runs their queries."""

from __future__ import annotations

import json

import yaml

from tests.utils import REPO

DASHBOARD = json.loads((REPO / "conf" / "grafana" / "sts-spark.json").read_text())
ALERTS = yaml.safe_load((REPO / "conf" / "prometheus" / "alerts.yml").read_text())


def test_the_dashboard_is_importable_with_any_prometheus_data_source() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource", "prometheus")
    panels = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])
    cells = set()
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def test_the_dashboard_shows_the_four_signals_and_the_spark_figures() -> None:
    exprs = " ".join(t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", []))
    for metric in ("sts_sidecar_queue_depth", "sts_sidecar_time_to_first_token_seconds_bucket",
                   "sts_sidecar_time_per_output_token_seconds_bucket",
                   "sts_sidecar_gpu_utilization_ratio", "sts_sidecar_gpu_memory_used_bytes",
                   "sts_sidecar_prefix_cache_hit_ratio", "sts_spark_input_rows_per_second",
                   "sts_spark_processed_rows_per_second", "sts_spark_batch_duration_seconds",
                   "sts_spark_backlog_requests", "sts_spark_answers_total"):
        assert metric in exprs, metric


def test_every_alert_has_a_severity_a_summary_and_a_threshold() -> None:
    rules = [r for g in ALERTS["groups"] for r in g["rules"]]
    assert len({r["alert"] for r in rules}) == len(rules)
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert any(op in r["expr"] for op in (" > ", " == ", " < ")), r["alert"]
