"""Scheme A, the baseline: the model called synchronously from ``foreachBatch``.

Built the way the seed's first version is: the same Spark source, the same L1/L2
(:func:`spark_ext.l1.tagging.build_requests`), the same trigger interval and the
same sidecar process as STS, but each micro-batch collects its requests on the
driver, calls the model and *waits* before the batch can commit, then writes the
answers to Delta. No deadline is enforced on the call (the seed's pitfall 1), so
the request carries a deadline one hour away that the sidecar never hits.

Two variants:

* ``sync``: a plain loop, one blocking ``Generate`` call after the other;
* ``concurrent``: the common "improvement": fire all of the batch's calls at once
  and wait for all of them (the batch takes as long as its slowest answer).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sidecar.client import SidecarClient, request_to_proto
from sidecar.contract import Status, now_ms
from sidecar.pb.sts.v1 import inference_pb2 as pb
from spark_ext.l4.answer_store import AnswerStore
from spark_ext.config import PipelineConfig
from spark_ext.l2.prompts import REQUEST_COLUMNS, build_requests
from spark_ext.l2.template import PromptTemplate

logger = logging.getLogger(__name__)

BaselineMode = Literal["sync", "concurrent"]
_NO_DEADLINE_MS = 3_600_000


@dataclass
class BaselineAnswer:
    request_id: str
    priority: str
    enqueue_ts: int
    sla_deadline_ts: int
    answered_ts: int
    ok: bool


@dataclass
class BaselineState:
    """What the baseline's batches did (read by the benchmark while it runs)."""

    answers: list[BaselineAnswer] = field(default_factory=list)
    batch_durations_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class BlockingForeachBatch:
    """The baseline query. ``start()`` returns the running :class:`StreamingQuery`."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, mode: BaselineMode) -> None:
        self.spark = spark
        self.config = config
        self.mode = mode
        self.state = BaselineState()
        self.store = AnswerStore(config.output.out_dir, key_columns=[])
        self._stop = threading.Event()
        self._client = SidecarClient(config.sidecar.endpoint, timeout_s=config.sidecar.timeout_s,
                                     security=config.sidecar.security())
        self.query: StreamingQuery | None = None

    def start(self) -> StreamingQuery:
        src = self.config.source
        events = (self.spark.readStream.schema(src.schema).options(**src.options)
                  .format(src.format).load(src.path))
        template = PromptTemplate(stable=self.config.template.stable,
                                  dynamic=self.config.template.dynamic)
        requests = build_requests(events, self.config.tagging, template)
        writer = (requests.select(*REQUEST_COLUMNS).writeStream
                  .queryName(f"baseline-{self.mode}")
                  .foreachBatch(self._batch)
                  .option("checkpointLocation",
                          str(Path(self.config.output.checkpoint_dir) / "baseline")))
        seconds = self.config.output.triggers["submit"]
        if seconds > 0:
            writer = writer.trigger(processingTime=f"{seconds} seconds")
        self.query = writer.start()
        return self.query

    def _request(self, row: dict) -> pb.InferenceRequest:
        row = dict(row)
        row["deadline_ts"] = row["enqueue_ts"] + _NO_DEADLINE_MS
        return request_to_proto(row)

    def _record(self, row: dict, result: pb.Result | None) -> BaselineAnswer:
        answer = BaselineAnswer(row["request_id"], row["priority"], row["enqueue_ts"],
                                row["deadline_ts"], now_ms(),
                                result is not None and result.status == Status.OK.wire)
        with self.state.lock:
            self.state.answers.append(answer)
        return answer

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = [r.asDict() for r in batch.collect()]
        answers: list[BaselineAnswer] = []
        if self.mode == "sync":
            for row in rows:
                if self._stop.is_set():
                    break
                try:
                    result = self._client.generate(self._request(row))
                except grpc.RpcError as e:
                    logger.warning("Generate failed: %s", e.code())
                    result = None
                answers.append(self._record(row, result))
        else:
            futures = [(row, self._client.generate_future(self._request(row))) for row in rows]
            for row, future in futures:
                while not future.done() and not self._stop.is_set():
                    time.sleep(0.01)
                if self._stop.is_set():
                    future.cancel()
                    continue
                try:
                    result = future.result()
                except grpc.RpcError:
                    result = None
                answers.append(self._record(row, result))
        if answers:
            self.store.append("answers", pa.table({
                "request_id": [a.request_id for a in answers],
                "priority": [a.priority for a in answers],
                "enqueue_ts": [a.enqueue_ts for a in answers],
                "answered_ts": [a.answered_ts for a in answers],
                "latency_ms": [a.answered_ts - a.enqueue_ts for a in answers],
                "ok": [a.ok for a in answers],
            }), app_id=f"baseline-{self.mode}/answers", version=batch_id)
        with self.state.lock:
            self.state.batch_durations_s.append(time.monotonic() - started)

    def stop(self) -> None:
        """Stop waiting for the model (a blocked batch returns at once) and the query."""
        self._stop.set()
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:  # a batch interrupted mid-write is fine at the end of a run
                logger.debug("baseline query stop", exc_info=True)
        self._client.close()
