"""Fire-and-forget submission: one SubmitBatch RPC per Arrow batch, ack rows out.

:func:`submit_requests` is a DataFrame -> DataFrame step built on
``mapInArrow``. It never waits for generation: each task sends its rows to the
sidecar and yields one ack row per request as soon as the sidecar admitted or
refused them. An unreachable or slow sidecar (connect/ack deadline
``timeout_s``) turns into ``accepted = false`` rows with reason ``unavailable``
instead of a failed query, so L4 answers those requests with the fallback; refused
credentials (``UNAUTHENTICATED``) are a misconfiguration and fail the task
(:class:`~spark_ext.exceptions.SidecarAuthError`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spark_ext.config import SidecarEndpointConfig
from spark_ext.exceptions import SidecarAuthError
from spark_ext.schemas import spark_schema
from spark_ext.submit.ack_channel import AckChannel
from spark_ext.submit.sidecar_launcher import (endpoint_for, executor_name, for_tasks, task_gpu,
                                               task_sidecar)
from spark_ext.tracing import SubmitSpans, driver_otel_env, task_tracing
from spark_ext.worker_gc import freeze_loaded

logger = logging.getLogger(__name__)

#: Columns the submit step adds to each request row (Arrow; the Spark schema is derived).
ACK_SCHEMA = pa.schema([
    ("accepted", pa.bool_()), ("reason", pa.string()), ("detail", pa.string()),
    ("duplicate", pa.bool_()), ("submit_ts", pa.int64()), ("sidecar_id", pa.string()),
    ("endpoint", pa.string()), ("sidecar_fallback_text", pa.string()),
])


#: The ``detail`` of an accepted duplicate whose prompt differs from the first request
#: under its id (the sidecar's ``id_conflict``): two events whose key columns are equal.
ID_CONFLICT_DETAIL = ("request_id conflict: an earlier request with another prompt had this "
                      "id; this one gets its answer")

#: How long a task of a running stream waits for its GPU's sidecar when it finds it
#: starting, or starts it (``launch: lazy``): a GPU executor that joins later (a scale-up,
#: an executor replaced after a failure) starts its sidecar in the background and its
#: requests are refused ``unavailable`` (the fallback answers them at once) until it
#: serves, instead of holding up the micro-batch, and with it every other GPU's requests,
#: for the warm-up (a minute or more for vLLM to load a model).
STREAM_START_WAIT_S = 1.0


def resolve_endpoint(config: SidecarEndpointConfig) -> str:
    """The sidecar this task should use: the one of its GPU, else the default.

    Spark assigns GPUs to tasks (``spark.task.resource.gpu.amount``); the first
    address ``N`` maps to ``config.gpu_endpoint.format(gpu=N)``. Nothing is started
    here (:func:`spark_ext.submit.sidecar_launcher.task_sidecar` also starts it with
    ``launch: lazy``).
    """
    return endpoint_for(config, task_gpu() if config.gpu_endpoint else None)


def _attribute(value: object) -> str:
    """A column value as a request attribute: lists comma-joined, anything else ``str``."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _refused(n: int, reason: str, detail: str, now: int, endpoint: str) -> dict[str, list]:
    return {"accepted": [False] * n, "reason": [reason] * n, "detail": [detail] * n,
            "duplicate": [False] * n, "submit_ts": [now] * n, "sidecar_id": [None] * n,
            "endpoint": [endpoint] * n, "sidecar_fallback_text": [None] * n}


def submit_batches(batches: Iterator[pa.RecordBatch], config: SidecarEndpointConfig,
                   attribute_columns: Sequence[str] = (),
                   extra_attributes: Mapping[str, str] | None = None,
                   otel_env: Mapping[str, str] | None = None, traceparent_column: str = "",
                   submit_when: str | None = None,
                   ack_channel: AckChannel | None = None,
                   start_wait_s: float | None = None,
                   delivery_ms: int = 0) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body: submit each batch, yield it with ack columns (no prompt).

    With ``submit_when`` (a boolean column) only the rows where it is true are
    submitted; the others pass through with null ack columns, so one job both
    submits the LLM-routed rows and returns the rows L1/L2 answered.

    Each request carries ``attributes`` (``extra_attributes`` plus ``attribute_columns``
    as strings; the sidecar echoes them on the result row) and ``submit_ts``. Acks are
    matched to rows by ``request_id``, not by position. With tracing on (``otel_env``, the driver's
    ``OTEL_*`` variables, or the worker's own) each request also carries its
    ``traceparent`` and the L1 spans are written (:mod:`spark_ext.tracing`). With
    ``ack_channel``, the task's ack rows are left there once all are submitted
    (:mod:`spark_ext.submit.ack_channel`). ``start_wait_s``: how long to wait for a
    lazily started sidecar that does not serve yet (default ``start_timeout_s``); past
    it, the requests are refused ``unavailable`` and it goes on starting. Each request
    carries ``delivery_ms``, the caller's answer path (``answers.delivery_ms``)."""
    from sidecar.client import SidecarClient

    freeze_loaded("submit")  # its imports: out of the per-task GC
    # Started first if launch: lazy and not serving; a sidecar still warming up does not
    # hold up the micro-batch: this task's requests get the fallback until it serves.
    endpoint, serving = task_sidecar(config, wait_s=start_wait_s)
    client = SidecarClient(endpoint, timeout_s=config.timeout_s, security=config.security())
    tracing = task_tracing(otel_env or {})
    attributes = _Attributes(attribute_columns, extra_attributes or {})
    acks: list[pa.RecordBatch] = []
    try:
        for batch in batches:
            if submit_when is not None:
                chosen = pc.fill_null(batch.column(submit_when), False)
                if (passed := batch.filter(pc.invert(chosen))).num_rows:
                    acks.append(_not_submitted(passed))
                    yield acks[-1]
                batch = batch.filter(chosen)
            for start in range(0, batch.num_rows, config.max_batch):
                spans = SubmitSpans(tracing, traceparent_column) if tracing is not None else None
                acks.append(_submit_chunk(client if serving else None, endpoint,
                                          batch.slice(start, config.max_batch),
                                          attributes, spans, delivery_ms))
                yield acks[-1]
        if ack_channel is not None:
            ack_channel.write(acks)
    finally:
        client.close()
        if tracing is not None:  # the task ends: its spans go out now (never waited for)
            tracing.flush_soon()


@dataclass(frozen=True)
class _Attributes:
    """What each request carries in ``attributes``: the fixed ``extra`` ones plus the
    row's ``columns`` as strings (the sidecar echoes them on the result row)."""

    columns: Sequence[str]
    extra: Mapping[str, str]

    def of(self, row: Mapping[str, object]) -> dict[str, str]:
        return {**self.extra, **{c: _attribute(row[c]) for c in self.columns
                                 if row.get(c) is not None}}


def _submit_chunk(client, endpoint: str, chunk: pa.RecordBatch, attributes: _Attributes,
                  spans: SubmitSpans | None, delivery_ms: int = 0) -> pa.RecordBatch:
    """One ``SubmitBatch`` call for ``chunk`` (none without ``client``: a sidecar still
    starting, every request refused ``unavailable``); the chunk back without its prompt,
    with the ack columns (:data:`ACK_SCHEMA`) added. Each request carries
    ``delivery_ms`` (the pipeline's answer path, ``answers.delivery_ms``)."""
    from sidecar.contract import now_ms

    rows = chunk.to_pylist()
    now = now_ms()
    for r in rows:
        r["submit_ts"] = now
        r["delivery_ms"] = delivery_ms
        r["attributes"] = attributes.of(r)
    if spans is not None:
        spans.prepare(rows)
    acks = (_ask(client, endpoint, rows, now) if client is not None else
            _refused(len(rows), "unavailable", "sidecar starting: not serving yet", now,
                     endpoint))
    keep = [n for n in chunk.schema.names if n != "prompt"]
    arrays = [chunk.column(n) for n in keep]
    if spans is not None:
        spans.end(acks["accepted"], acks["reason"], endpoint)
        if "trace_id" in keep:  # the W3C trace ids
            arrays[keep.index("trace_id")] = pa.array(
                [r["trace_id"] for r in rows], chunk.column("trace_id").type)
    arrays += [pa.array(acks[f.name], type=f.type) for f in ACK_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, names=keep + ACK_SCHEMA.names)


def _ask(client, endpoint: str, rows: list[dict], now: int) -> dict[str, list]:
    """The ack columns of ``rows`` from the sidecar; ``unavailable`` refusals when it
    does not answer. Refused credentials are no fallback: they raise.

    Raises:
        SidecarAuthError: the sidecar refused the credentials.
    """
    import grpc

    from sidecar.client import describe_rpc_error, request_to_proto
    from sidecar.pb.sts.v1 import inference_pb2 as pb

    try:
        reply = client.submit([request_to_proto(r) for r in rows])
    except grpc.RpcError as e:
        code = e.code()
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise SidecarAuthError(describe_rpc_error(e, endpoint)) from None
        logger.warning("Sidecar %s did not ack %d requests: %s", endpoint, len(rows), code)
        return _refused(len(rows), "unavailable", f"{code.name}: {e.details()}", now, endpoint)
    _check_ack_identity(rows, reply.acks)
    conflicts = sum(a.id_conflict for a in reply.acks)
    if conflicts:
        logger.warning("%d of %d requests share their request_id with a different earlier "
                       "request (ack detail %r): each gets the first one's answer; make the "
                       "key columns unique", conflicts, len(rows), ID_CONFLICT_DETAIL)
    return {
        "accepted": [a.accepted for a in reply.acks],
        "reason": [None if a.accepted else
                   pb.RefusalReason.Name(a.reason).removeprefix("REFUSAL_REASON_").lower()
                   for a in reply.acks],
        "detail": [ID_CONFLICT_DETAIL if a.id_conflict else a.detail or None
                   for a in reply.acks],
        "duplicate": [a.duplicate for a in reply.acks],
        "submit_ts": [now] * len(rows),
        "sidecar_id": [reply.sidecar_id] * len(rows),
        "endpoint": [endpoint] * len(rows),
        "sidecar_fallback_text": [a.fallback_text or None for a in reply.acks],
    }


def _not_submitted(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without ``prompt``, with null ack columns (rows not submitted)."""
    keep = [n for n in batch.schema.names if n != "prompt"]
    arrays = [batch.column(n) for n in keep]
    arrays += [pa.nulls(batch.num_rows, f.type) for f in ACK_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, names=keep + ACK_SCHEMA.names)


def _check_ack_identity(rows: list[dict], acks: Sequence) -> None:
    """One ack per row, in order, each naming its row's request (a request without an
    id is refused with an empty one).

    Raises:
        RuntimeError: an ack is missing, extra or for another request.
    """
    if len(acks) != len(rows):
        raise RuntimeError(f"{len(acks)} acks for {len(rows)} requests")
    for row, ack in zip(rows, acks):
        if ack.request_id != (row.get("request_id") or ""):
            raise RuntimeError(f"ack for {ack.request_id!r} where {row.get('request_id')!r} "
                               "was submitted")


def ack_schema(requests: DataFrame) -> StructType:
    """Schema of :func:`submit_requests`'s output for a given request DataFrame."""
    kept = [f for f in requests.schema.fields if f.name != "prompt"]
    return StructType(kept + spark_schema(ACK_SCHEMA).fields)


def submit_requests(requests: DataFrame, config: SidecarEndpointConfig,
                    attribute_columns: Sequence[str] = (),
                    extra_attributes: Mapping[str, str] | None = None, *,
                    traceparent_column: str | None = None,
                    submit_when: str | None = None,
                    ack_channel: AckChannel | None = None,
                    start_wait_s: float | None = None,
                    delivery_ms: int = 0) -> DataFrame:
    """Send every request row to the sidecar; return one ack row per request.

    The output keeps the input columns except ``prompt`` and adds ``accepted``,
    ``reason``, ``detail``, ``duplicate``, ``submit_ts``, ``sidecar_id``,
    ``endpoint`` and ``sidecar_fallback_text`` (the sidecar pool's rule answer,
    set on refusals; L4 prefers it to the pipeline's own fallback text). With tracing
    on, ``trace_id`` holds the W3C trace id and ``traceparent_column`` names the
    events' own trace context (docs/metrics.md, "Tracing"). With ``submit_when`` (a boolean
    column) only the rows where it is true are submitted; the others come out with
    null ack columns (``accepted`` null means "not submitted"). With ``ack_channel``
    every task also leaves its ack rows there for the answers query. With ``launch:
    lazy`` a task waits ``start_wait_s`` (default ``start_timeout_s``) for its GPU's
    sidecar to serve; a stream passes :data:`STREAM_START_WAIT_S`. Each request carries
    ``delivery_ms``: how long before its deadline the caller wants its result (its answer
    path; the sidecar aims to finish that early).

    Usage::

        acks = submit_requests(build_requests(events, tagging, template),
                               SidecarEndpointConfig(endpoint="127.0.0.1:50051"))
    """
    columns, extra = list(attribute_columns), dict(extra_attributes or {})
    config = for_tasks(config)
    otel, parent = driver_otel_env(), traceparent_column or ""
    return requests.mapInArrow(
        lambda it: submit_batches(it, config, columns, extra, otel, parent, submit_when,
                                  ack_channel, start_wait_s, delivery_ms),
        ack_schema(requests))


#: Columns of :func:`check_sidecars`'s rows.
SIDECAR_CHECK_SCHEMA = pa.schema([("partition", pa.int64()), ("endpoint", pa.string()),
                                  ("serving", pa.bool_()), ("error", pa.string()),
                                  ("sidecar_id", pa.string()), ("gpus", pa.int32()),
                                  ("desired_gpus", pa.int32()),
                                  ("desired_gpus_exact", pa.float64()),
                                  ("demand_tokens_per_s", pa.float64()),
                                  ("executor", pa.string()),
                                  ("result_channel", pa.string()),
                                  ("intake_topic", pa.string())])


def _check_partition(batches: Iterator[pa.RecordBatch], config: SidecarEndpointConfig
                     ) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of :func:`check_sidecars`: import what submission
    imports and ask this task's sidecar for its health."""
    from pyspark import TaskContext

    from sidecar.client import SidecarClient

    for _ in batches:
        pass
    ctx = TaskContext.get()
    endpoint = resolve_endpoint(config)
    serving, error, stats = False, None, None
    try:
        task_sidecar(config)  # with launch: lazy, the check starts the sidecars and waits
        with SidecarClient(endpoint, timeout_s=config.timeout_s,
                           security=config.security()) as client:
            serving = client.is_serving()
            stats = client.stats() if serving else None
    except Exception as e:  # reported as a row; the pipeline decides what to do
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    scale = stats.scale if stats is not None and stats.HasField("scale") else None
    yield pa.RecordBatch.from_pydict(
        {"partition": [ctx.partitionId() if ctx is not None else -1], "endpoint": [endpoint],
         "serving": [serving], "error": [error],
         "sidecar_id": [stats.sidecar_id if stats is not None else None],
         "gpus": [scale.gpus if scale else None],
         "desired_gpus": [scale.desired_gpus if scale else None],
         "desired_gpus_exact": [scale.desired_gpus_exact if scale else None],
         "demand_tokens_per_s": [scale.demand_tokens_per_s if scale else None],
         "executor": [executor_name()],
         "result_channel": [stats.result_channel.kind or None
                            if stats is not None and stats.HasField("result_channel") else None],
         "intake_topic": [stats.intake_topic  # a sidecar too old to say: None
                          if stats is not None and stats.HasField("intake_topic") else None]},
        schema=SIDECAR_CHECK_SCHEMA)


def check_sidecars(spark: SparkSession, config: SidecarEndpointConfig,
                   tasks: int | None = None) -> list[dict]:
    """Ask, from ``tasks`` Python tasks on the executors (default: the default
    parallelism), whether each task's sidecar is serving.

    It is the pipeline's start-up check (an executor that cannot reach its sidecar
    is reported before events flow), and it warms the Python workers that
    submission reuses (``spark.python.worker.reuse``), so the first micro-batch
    does not pay for starting them.

    Returns:
        One dict per task: ``partition``, ``endpoint``, ``serving``, ``error``, and the
        sidecar's ``sidecar_id`` and scale signal (``gpus``, ``desired_gpus``,
        ``desired_gpus_exact``, ``demand_tokens_per_s``; ``None`` when it does not serve),
        the task's ``executor``, the ``result_channel`` the sidecar writes to and the
        ``intake_topic`` it reads requests from (``""``: none).
    """
    from spark_ext.session import task_slots

    n = tasks or task_slots(spark)
    df = spark.range(n, numPartitions=n)
    config = for_tasks(config)
    return (df.mapInArrow(lambda it: _check_partition(it, config),
                          spark_schema(SIDECAR_CHECK_SCHEMA))
            .toArrow().to_pylist())
