"""The shipped monitoring against a real Prometheus server: it scrapes a loaded sidecar
(simulated engine, GPU figures from the NVML test double in ``tests/fake_nvml``) and the
Spark driver of a short real pipeline run, then every Grafana panel's query and every
alert's expression of ``conf/`` is run through the HTTP API.

Criteria: a panel query returns at least one series with a finite value (a panel that
shows "No data" is a defect). An alert expression is ``<query> <comparison> <threshold>``;
its query (the expression without the top-level comparison) returns at least one series,
so the alert watches series that exist; the rule evaluates without error, and the one
the traffic provokes (a high-priority shed) fires.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from spark_ext.config import PipelineConfig
from spark_ext.pipeline.sts_pipeline import StsPipeline
from spark_ext.sources.kafka import ensure_topics
from sts_harness.replay import KafkaTopicSink
from tests.utils import REPO, RemoteSidecar, free_port, require_tool, wait_until

pytestmark = pytest.mark.timeout(300)

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = REPO / "conf" / "grafana" / "sts-spark.json"
ALERTS = REPO / "conf" / "prometheus" / "alerts.yml"
SCRAPE_CONFIG = REPO / "conf" / "prometheus" / "prometheus.yml"
GIB = 1 << 30
FAKE_GPUS = [{"uuid": "GPU-0000", "util": 35, "used": 70 * GIB, "total": 80 * GIB},
             {"uuid": "GPU-1111", "util": 0, "used": 0, "total": 80 * GIB},
             {"uuid": "GPU-2222", "util": 90, "used": 72 * GIB, "total": 80 * GIB}]
RATE_INTERVAL = "10m"
"""What Grafana's ``$__rate_interval`` stands for in the queries run here: longer than
the test, so a slow machine cannot push the traffic out of the window."""


class Prometheus:
    """A Prometheus server on a free loopback port, scraping every second."""

    def __init__(self, workdir: Path, sidecar_metrics: str, driver_metrics: str) -> None:
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(ALERTS)]
        targets = {"sts-sidecar": sidecar_metrics, "sts-spark-driver": driver_metrics}
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> "Prometheus":
        self._log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config_file}",
             f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(self._ready, 60, 0.2, what="Prometheus ready")
        return self

    def _ready(self) -> bool:
        assert self.proc.poll() is None, (self.workdir / "prometheus.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def api(self, path: str, **params: str) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400: the query does not parse
            body = json.load(e)
        assert body["status"] == "success", f"{params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]


def _without_comparison(expr: str) -> str:
    """The query of ``<query> <op> <threshold>``: the left side of the last comparison
    outside brackets and quotes."""
    depth, quote, cut = 0, "", None
    for i, ch in enumerate(expr):
        if quote:
            quote = "" if ch == quote and expr[i - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and re.match(r"(==|!=|>=|<=|>|<)", expr[i:]) and (
                cut is None or i > cut + 2):
            cut = i
    assert cut is not None, f"no top-level comparison in {expr!r}"
    return expr[:cut].strip()


def _panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v.get("allValue") for v in dashboard["templating"]["list"]}
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            for name, all_value in variables.items():
                if all_value is not None:
                    expr = expr.replace(f"${name}", all_value)
            assert "$" not in expr, f"unresolved variable in {panel['title']}: {expr}"
            out.append((f"{panel['title']} [{target['refId']}]", expr))
    return out


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
            for rule in group["rules"]]


def _events() -> list[dict]:
    """Three answerable tickets per priority, and one high and one low ticket asking for
    far more tokens than their deadline allows (2000 tokens at 100 ms a step, 60 s: both
    shed, deadline_infeasible). Deadlines are long: a busy machine is slow to submit."""
    events = [{"event_id": f"mon-{p}-{i}", "text": f"My order {i} is late.", "priority": p,
               "event_ts": 0, "budget": 4} for p in ("high", "normal", "low") for i in range(3)]
    return events + [{"event_id": f"mon-{p}-long", "text": "Tell me everything.",
                      "priority": p, "event_ts": 0, "budget": 2000} for p in ("high", "low")]


@pytest.fixture(scope="module")
def loaded(spark, kafka_broker, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[SimpleNamespace]:
    require_tool("prometheus", "Debian's prometheus package")
    tmp = tmp_path_factory.mktemp("monitoring")
    sidecar_port, driver_port = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as env:  # only the sidecar finds the NVML double
            env.setenv("PYTHONPATH", os.pathsep.join(
                [str(REPO / "tests" / "fake_nvml"), *filter(None, [os.environ.get("PYTHONPATH")])]))
            env.setenv("STS_FAKE_NVML", json.dumps(FAKE_GPUS))
            env.setenv("CUDA_VISIBLE_DEVICES", "0,2")
            sidecar = stack.enter_context(RemoteSidecar(tmp / "results", [
                "--engine", "simulated", "--sidecar-id", "monitored",
                "--set", "engine.simulated.step_base_ms=100",
                "--set", "results.flush_interval_s=0.05",
                "--metrics-port", str(sidecar_port)], log_path=tmp / "sidecar.log"))
        topic = f"monitored-{os.getpid()}"  # events on Kafka: the lag panel has series too
        ensure_topics({"bootstrap.servers": kafka_broker.bootstrap_servers}, [topic])
        cfg = PipelineConfig.from_dict({
            "source": {"format": "kafka", "schema": "event_id STRING, text STRING, "
                       "priority STRING, event_ts LONG, budget INT",
                       "options": {"subscribe": topic, "startingOffsets": "earliest"}},
            "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers},
            "tagging": {"event_time_ms": None, "max_tokens": 2000, "max_tokens_column": "budget",
                        "sla_ms": {"high": 60_000, "normal": 60_000, "low": 60_000}},
            "sidecar": {"endpoint": sidecar.target, "results_dir": str(sidecar.results_dir),
                        "timeout_s": 3.0, "check_at_start": False},
            "answers": {"grace_ms": 1000},
            "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                       "metrics_port": driver_port, "writer": "deltalake"},
        })
        pipeline = StsPipeline(spark, cfg)
        stack.callback(pipeline.stop)
        pipeline.start()
        prometheus = stack.enter_context(Prometheus(
            tmp, f"127.0.0.1:{sidecar_port}", f"127.0.0.1:{driver_port}"))
        # Every target scraped once before the traffic, so rates over the window see it.
        try:
            wait_until(lambda: sorted(float(s["value"][1]) for s in prometheus.query("up"))
                       == [1, 1], 60, 0.2, what="both targets scraped")
        except AssertionError as e:  # say which target and why
            raise AssertionError(f"{e}: " + "; ".join(
                f"{t['scrapeUrl']} {t['health']} {t['lastError']!r} in {t['lastScrapeDuration']} s"
                for t in prometheus.api("targets")["activeTargets"])) from None
        events = _events()
        sink = KafkaTopicSink(kafka_broker.bootstrap_servers, topic)
        sink(0, 0, events)
        sink.close()
        deadline = time.monotonic() + 90
        while pipeline.store.stats.answers_written < len(events):
            assert time.monotonic() < deadline, "the pipeline did not answer every ticket"
            pipeline.process_all_available()
            time.sleep(0.2)

        def scraped() -> bool:
            answers = prometheus.query("sum(sts_spark_answers_total)")
            return bool(answers) and float(answers[0]["value"][1]) == len(events)

        wait_until(scraped, 30, 0.2, what="Prometheus scraped the answers")
        # A series first seen in that scrape (the fallback answers') has one sample, and
        # rate() needs two: one more scrape of both targets.
        counted_at = time.time()

        def scraped_again() -> bool:
            ups = prometheus.query("timestamp(up)")
            return len(ups) == 2 and min(float(u["value"][1]) for u in ups) > counted_at

        wait_until(scraped_again, 30, 0.2, what="one more scrape of both targets")
        # The listener has seen the answers query's batch: every Spark series is there.
        wait_until(lambda: prometheus.query('sts_spark_batches_total{query="sts-answers"}'),
                   30, 0.2, what="the answers query's micro-batch scraped")
        yield SimpleNamespace(prometheus=prometheus,
                              sidecar_metrics=f"http://127.0.0.1:{sidecar_port}/metrics",
                              driver_metrics=f"http://127.0.0.1:{driver_port}/metrics")


def test_the_endpoints_pass_promtool_gpu_series_included(loaded: SimpleNamespace) -> None:
    promtool = require_tool("promtool", "Debian's prometheus package")
    texts = {}
    for url in (loaded.sidecar_metrics, loaded.driver_metrics):
        with urllib.request.urlopen(url, timeout=10) as r:
            texts[url] = text = r.read().decode()
        lint = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True, timeout=30)
        assert lint.returncode == 0, f"{url}: {lint.stdout}{lint.stderr}"
    assert "sts_sidecar_gpu_memory_used_bytes{" in texts[loaded.sidecar_metrics]


def test_every_dashboard_panel_query_returns_data(loaded: SimpleNamespace) -> None:
    prometheus = loaded.prometheus
    empty = []
    for title, expr in _panel_queries():
        values = [float(s["value"][1]) for s in prometheus.query(expr)]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title}: {expr} -> {values}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    # The template variables list the scraped sidecar and driver.
    for variable in ("sts_sidecar_engine_up", "sts_spark_requests_submitted_total"):
        assert prometheus.query(variable)
    # GPU series: only the sidecar's GPUs (CUDA_VISIBLE_DEVICES=0,2 of three).
    gpus = prometheus.query("sts_sidecar_gpu_utilization_ratio")
    assert sorted((s["metric"]["gpu"], float(s["value"][1])) for s in gpus) == [
        ("0", 0.35), ("2", 0.9)]
    # The prefix cache found the template's stable prefix in the tickets' prompts.
    [hit] = prometheus.query("sts_sidecar_prefix_cache_hit_ratio")
    assert float(hit["value"][1]) > 0
    [cached] = prometheus.query("sum(sts_sidecar_cached_prompt_tokens_total)")
    assert float(cached["value"][1]) > 0


def test_every_alert_watches_existing_series_and_evaluates(loaded: SimpleNamespace) -> None:
    prometheus = loaded.prometheus
    missing = []
    for rule in _alerts():
        query = _without_comparison(rule["expr"])
        if not prometheus.query(query):
            missing.append(f"{rule['alert']}: {query}")
    assert not missing, "alerts built on series that do not exist:\n" + "\n".join(missing)

    def evaluated() -> list[dict]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if all(r.get("lastEvaluation", "0001").startswith("2") for r in rules) \
            else []

    rules = wait_until(evaluated, 30, 0.2, what="every rule evaluated")
    assert sorted(r["name"] for r in rules) == sorted(r["alert"] for r in _alerts())
    assert {r["name"]: r["health"] for r in rules if r["health"] != "ok"} == {}
    # The high-priority ticket that could not meet its deadline was shed: that alert fires.
    firing = wait_until(lambda: {a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]
                                 if a["state"] == "firing"}, 30, 0.2, what="an alert fires")
    assert "StsHighPriorityMissed" in firing
    assert "StsSidecarDown" not in firing and "StsSidecarEngineDown" not in firing


def test_the_shipped_files_pass_promtool() -> None:
    promtool = require_tool("promtool", "Debian's prometheus package")
    for args in (["check", "rules", str(ALERTS)], ["check", "config", str(SCRAPE_CONFIG)]):
        check = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
