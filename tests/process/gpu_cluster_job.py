"""A real multi-executor Spark with one fake GPU per executor and lazily started sidecars.

Run by ``test_gpu_cluster.py`` in its own process (a ``local-cluster`` session cannot
share a process with the suite's ``local`` one)::

    python -m tests.process.gpu_cluster_job WORK_DIR    # prints a JSON report

``local-cluster[2,1,1024]``: two workers, each with one executor of one core and one
GPU, found by ``sts_harness/fake_gpu_discovery.sh`` (the first worker gets address ``0``, the
second ``1``). Tasks take one GPU each and submit through
:func:`spark_ext.submit.submission.submit_requests` with ``launch: lazy`` and the simulated
engine, so the first task on each GPU starts that GPU's sidecar. Each request carries
the GPU its task was given (``task_gpu``, recorded before submission and echoed by
the sidecar as an attribute), so the report shows where every request went: its ack
(endpoint, sidecar id), its result row (sidecar id, attribute), and each sidecar's
own count of submitted requests. The results are read twice: with pyarrow, and by
the pipeline's results stream (``sts_results``) from the one shared folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from sts_harness.gpu_cluster import executors, gpu_cluster_session, until_executors

#: Requests per round, and tasks (partitions) per round.
ROWS, TASKS = 48, 8
#: ``max_tokens`` of the round acknowledged just before an executor is released: about
#: 5 s each on the simulated engine, so its sidecar still holds work when it goes.
DRAIN_MAX_TOKENS = 400
#: Requests in that round: about 8 per sidecar, so the queued ones (`low` runs one at a
#: time) wait well within their pools' queue delay and deadline on a slow machine too
#: (with 24 per sidecar, the eighth `low` one could be refused as ``queue_delay_exceeded``).
DRAIN_ROWS = 16
#: How long a released executor's sidecar waits for a replacement before it drains.
ORPHAN_EXIT_S = 2.0
#: A sidecar held for about a minute before it serves: one warm-up generation of 5,000
#: tokens at the simulated engine's 12.5 ms a token alone.
HOLD_ARGS = ["--set", 'warmup.prompts=["hold"]', "--set", "warmup.rounds=1",
             "--set", "warmup.max_tokens=5000", "--set", "warmup.calibrate=false"]
#: Longest the new executor's rounds are awaited after the scale-up.
HOLD_TIMEOUT_S = 240.0
REQUEST_DDL = ("request_id string, trace_id string, priority string, enqueue_ts long, "
               "deadline_ts long, prompt string, max_tokens int, task_gpu string, round int")

REQUEST_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("trace_id", pa.string()), ("priority", pa.string()),
    ("enqueue_ts", pa.int64()), ("deadline_ts", pa.int64()), ("prompt", pa.string()),
    ("max_tokens", pa.int32()), ("task_gpu", pa.string()), ("round", pa.int32()),
])


def _requests(batches: Iterator[pa.RecordBatch], round_no: int,
              max_tokens: int = 8) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: request rows from ids, tagged with this task's GPU."""
    from sidecar.contract import now_ms
    from spark_ext.submit.sidecar_launcher import task_gpu

    gpu = task_gpu()
    for batch in batches:
        ids = batch.column("id").to_pylist()
        now = now_ms()
        yield pa.RecordBatch.from_pydict({
            "request_id": [f"r{round_no}-{i}" for i in ids],
            "trace_id": [f"t{round_no}-{i}" for i in ids],
            "priority": [("high", "normal", "low")[i % 3] for i in ids],
            "enqueue_ts": [now] * len(ids), "deadline_ts": [now + 60_000] * len(ids),
            "prompt": [f"Ticket {i}: my order is late." for i in ids],
            "max_tokens": [max_tokens] * len(ids), "task_gpu": [gpu] * len(ids),
            "round": [round_no] * len(ids)}, schema=REQUEST_SCHEMA)


def _session(work: Path):
    from spark_ext.submit.executor_ready import plugin_conf

    return gpu_cluster_session(work, workers=2, cores=1, memory_mb=1024,
                               conf=plugin_conf(timeout_s=HOLD_TIMEOUT_S))


def _wait_for_executors(spark, n: int, timeout_s: float = 120.0) -> None:
    """Until at least ``n`` executors have registered."""
    deadline = time.monotonic() + timeout_s
    while executors(spark) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} executors not up after {timeout_s}s")
        time.sleep(0.2)


def _sidecar_pids(run: Path) -> dict[str, int]:
    """GPU -> pid of its lazily started sidecar (from the launcher's pid files)."""
    return {p.stem.removeprefix("sts-gpu"): int(p.read_text()) for p in run.glob("sts-gpu*.pid")}


def _running(pid: int) -> bool:
    from sidecar import pid_running

    return pid_running(pid)


class _ServingWatch(threading.Thread):
    """When a sidecar first serves (driver clock, epoch ms), asked every 0.2 s."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.serving_ms, self._stop = endpoint, None, threading.Event()

    def run(self) -> None:
        from sidecar.client import SidecarClient
        from sidecar.contract import now_ms

        while not self._stop.wait(0.2):
            try:
                with SidecarClient(self.endpoint, timeout_s=1.0) as client:
                    if client.is_serving():
                        self.serving_ms = now_ms()
                        return
            except Exception:  # not there yet
                pass

    def stop(self) -> None:
        self._stop.set()


def _stream_while_held(spark, config, new_gpus: set[str], decided_ms: int) -> dict:
    """Rounds of requests, one after the other, from the scale-up decision until a task
    runs on a new executor: what a stream does while the new GPU's sidecar starts."""
    from sidecar.contract import now_ms
    from spark_ext.submit.sidecar_launcher import endpoint_for
    from spark_ext.submit.submission import submit_requests

    watch = _ServingWatch(endpoint_for(config, sorted(new_gpus)[0]))
    watch.start()
    rounds, new_requests = [], []
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            began, began_ms = time.monotonic(), now_ms()
            requests = (spark.range(ROWS, numPartitions=TASKS)
                        .mapInArrow(lambda it, r=10 + len(rounds): _requests(it, r),
                                    REQUEST_DDL))
            rows = submit_requests(requests, config, attribute_columns=["task_gpu"]) \
                .select("task_gpu", "enqueue_ts", "accepted", "reason").toArrow().to_pylist()
            rounds.append({"start_ms": began_ms, "s": round(time.monotonic() - began, 2),
                           "gpus": sorted({r["task_gpu"] for r in rows}),
                           "refused": sorted({r["reason"] for r in rows if not r["accepted"]})})
            new_requests += [r["enqueue_ts"] for r in rows if r["task_gpu"] in new_gpus]
            if new_requests:
                break
    finally:
        watch.stop()
    return {"decided_ms": decided_ms, "serving_ms": watch.serving_ms, "rounds": rounds,
            "new_gpu_first_request_ms": min(new_requests) if new_requests else None}


def _scale_down_and_up(spark, config, run: Path, results: Path) -> dict:
    """The scaling controller's actuator (:class:`spark_ext.pipeline.scaling.SparkExecutors`)
    on the standalone backend: release one executor (2 -> 1) while both sidecars hold
    work (a round of longer requests just acknowledged), then ask for one (1 -> 2). The
    released executor's sidecar must finish that work and then exit (``orphan_exit_s``).
    Before the scale-up the job announces a sidecar that takes a minute to start: the
    executor-ready plugin holds the new executor until its GPU's sidecar serves, while
    rounds of requests go on on the serving executor; then a round's tasks land there,
    and the time from the decision to its first answer is reported."""
    from sidecar.contract import now_ms
    from spark_ext.pipeline.scaling import ScaleDecision, SparkExecutors
    from spark_ext.submit.executor_ready import announce
    from spark_ext.submit.submission import submit_requests
    from sts_harness.result_check import wait_for_results

    pids = _sidecar_pids(run)
    requests = (spark.range(DRAIN_ROWS, numPartitions=TASKS)
                .mapInArrow(lambda it: _requests(it, 3, max_tokens=DRAIN_MAX_TOKENS),
                            REQUEST_DDL))
    acks = submit_requests(requests, config, attribute_columns=["task_gpu"]) \
        .select("request_id", "accepted", "reason").toArrow().to_pylist()
    executors = SparkExecutors(spark)
    before = executors.current()
    released_at = time.monotonic()
    down = executors.apply(ScaleDecision("down", before - 1, "test"), before)
    down_s = until_executors(spark, before - 1)
    after_down = executors.current()
    exited: dict[str, float] = {}
    while not exited and time.monotonic() - released_at < 120:
        exited = {gpu: round(time.monotonic() - released_at, 1)
                  for gpu, pid in pids.items() if not _running(pid)}
        time.sleep(0.2)
    by_id = wait_for_results(results, {a["request_id"] for a in acks}, timeout_s=120.0)
    announced = announce(spark, dataclasses.replace(
        config, launch_args=[*config.launch_args, *HOLD_ARGS]))
    decided_ms = now_ms()
    up = executors.apply(ScaleDecision("up", before, "test"), after_down)
    held = _stream_while_held(spark, config, set(exited), decided_ms)
    up_s = until_executors(spark, before)
    # The new executor's sidecar serves; a round's answers from it.
    requests = (spark.range(ROWS, numPartitions=TASKS)
                .mapInArrow(lambda it: _requests(it, 4), REQUEST_DDL))
    out = submit_requests(requests, config, attribute_columns=["task_gpu"]) \
        .select("request_id", "sidecar_id").toArrow().to_pylist()
    answered = wait_for_results(results, {a["request_id"] for a in out}, timeout_s=120.0)
    restarted = {f"{socket.gethostname()}-gpu{gpu}" for gpu in exited}
    firsts = [r["finish_ts"] for r in answered.values() if r["sidecar_id"] in restarted]
    return {"before": before, "down_applied": down, "after_down": after_down,
            "up_applied": up, "after_up": executors.current(),
            "down_s": round(down_s, 1), "up_s": round(up_s, 1),
            "decision_to_first_answer_s": round((min(firsts) - decided_ms) / 1000, 1)
            if firsts else None,
            "decommission": spark.conf.get("spark.decommission.enabled"),
            "drain_acks": acks, "drain_statuses": sorted(r["status"] for r in by_id.values()),
            "drain_sidecars": sorted({r["sidecar_id"] for r in by_id.values()}),
            "sidecar_exited_s": exited,
            "still_running": sorted(gpu for gpu, pid in pids.items() if _running(pid)),
            "held": {"announced": announced, **held}}


def _read_with_results_stream(spark, results: Path, work: Path) -> list[dict]:
    """Every row of the shared results folder, as the answers query reads them (the
    partitioned reader: Spark tasks on the executors read the files)."""
    from spark_ext.sources.result_files import register_results_source

    register_results_source(spark)
    query = (spark.readStream.format("sts_results").option("path", str(results))
             .option("retentionSeconds", "3600").option("reader", "partitioned").load()
             .select("request_id", "sidecar_id", "attributes", "late")
             .writeStream.format("memory").queryName("sts_cluster_results")
             .option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    rows = spark.table("sts_cluster_results").collect()
    return [{"request_id": r.request_id, "sidecar_id": r.sidecar_id,
             "task_gpu": (r.attributes or {}).get("task_gpu"), "late": r.late} for r in rows]


def main(work: Path) -> dict:
    from sidecar.client import SidecarClient
    from spark_ext.config import SidecarEndpointConfig
    from spark_ext.submit.sidecar_launcher import endpoint_for, stop_sidecars
    from spark_ext.submit.submission import submit_requests
    from sts_harness.result_check import wait_for_results

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    run, results = work / "run", work / "results"
    os.chdir(work)  # relative folders are the driver's: tasks run in the executors' own
    config = SidecarEndpointConfig(
        endpoint="unix:///nonexistent/sts-no-gpu.sock",  # a task without a GPU fails visibly
        gpu_endpoint=f"unix://{run}/sts-gpu{{gpu}}.sock", launch="lazy",
        launch_args=["--engine", "simulated"], run_dir="run", results_dir="results",
        start_timeout_s=60.0, orphan_exit_s=ORPHAN_EXIT_S)
    spark = _session(work)
    try:
        _wait_for_executors(spark, 2)
        timings["cluster_up_s"] = time.monotonic() - t0
        acks: list[dict] = []
        for round_no in (1, 2):  # round 2 finds the sidecars serving and reuses them
            t = time.monotonic()
            requests = (spark.range(ROWS, numPartitions=TASKS)
                        .mapInArrow(lambda it, r=round_no: _requests(it, r), REQUEST_DDL))
            out = submit_requests(requests, config, attribute_columns=["task_gpu"])
            acks += out.select("request_id", "task_gpu", "round", "accepted", "reason",
                               "endpoint", "sidecar_id").toArrow().to_pylist()
            timings[f"round{round_no}_s"] = time.monotonic() - t
        ids = {a["request_id"] for a in acks}
        by_id = wait_for_results(results, ids, timeout_s=60.0)
        result_rows = [{"request_id": rid, "status": r["status"], "sidecar_id": r["sidecar_id"],
                        "task_gpu": dict(r["attributes"] or {}).get("task_gpu")}
                       for rid, r in by_id.items()]
        stats = {}
        for gpu in sorted({a["task_gpu"] for a in acks if a["task_gpu"] is not None}):
            with SidecarClient(endpoint_for(config, gpu)) as client:
                s = client.stats()
            stats[gpu] = {"sidecar_id": s.sidecar_id, "submitted": s.submitted,
                          "accepted": s.accepted, "engine": s.engine}
        t = time.monotonic()
        streamed = _read_with_results_stream(spark, results, work)
        timings["results_stream_s"] = time.monotonic() - t
        logs = {p.stem: p.read_text(errors="replace").count("sts sidecar ready")
                for p in sorted(run.glob("sts-*.log"))}
        scaling = _scale_down_and_up(spark, config, run, results)
        return {"host": socket.gethostname(), "gpu_endpoint": config.gpu_endpoint,
                "acks": acks, "results": result_rows, "streamed": streamed, "stats": stats,
                "sidecar_starts": logs, "scaling": scaling, "timings": timings}
    finally:
        spark.stop()
        stop_sidecars(run)


if __name__ == "__main__":
    report = main(Path(sys.argv[1]).resolve())
    print(json.dumps(report))
