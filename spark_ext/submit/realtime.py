"""The submit query in Spark's Real-Time Mode (``output.triggers.submit: realtime``).

In a micro-batch an event waits for the next batch to be planned and for a Python task
to send it (0.5-1.4 s here); in Real-Time Mode (RTM) the Kafka source's long-running
tasks hand each record on as it arrives, but only through the operators and sinks RTM
allows: Spark refuses the ``mapInArrow`` that sends ``SubmitBatch``, and a Python
``foreach`` writer receives its rows in batches that double in size until the
real-time batch ends (the JVM's pickler; measured: P50 2.5 s at 50 events/s). What RTM
runs without delay is Kafka to Kafka with built-in expressions, so the request rows
(L1 tags, the L2 prompt: :func:`spark_ext.l2.prompts.build_requests`) go as JSON to
``kafka.requests_topic``, and the sidecars read that topic themselves
(``intake.topic``, :mod:`sidecar.kafka_intake`).

Every row of the query becomes one record (:func:`request_records`):

- a request to submit goes to the requests topic: its row (prompt included), its
  ``attributes`` (the key columns and the pipeline's own, echoed on the result) and
  ``accepted: true`` -- the answers query reads these records as the requests' acks, so
  each is watched and gets the fallback at ``deadline + grace`` if no result comes (a
  sidecar that is down, a topic nobody reads); the sidecar's refusal arrives as the
  request's result row;
- a row not submitted (a dead letter) goes to the acks topic with null ack columns, as
  a micro-batch's submit task leaves it.

A replayed real-time batch writes its records again (Spark's Kafka sink is
at-least-once): the sidecar admits a request once (its de-duplication window) and the
ledger keeps one answer per request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_ext.submit.ack_channel import PIPELINE_FIELD

#: How long each real-time batch (a checkpoint of the Kafka offsets) runs.
REALTIME_BATCH = "5 seconds"
#: The ``endpoint`` of a request submitted through the requests topic.
ENDPOINT_PREFIX = "kafka:"


def request_records(requests: DataFrame, *, pipeline_id: str, requests_topic: str,
                    acks_topic: str, attribute_columns: Sequence[str] = (),
                    extra_attributes: Mapping[str, str] | None = None,
                    submit_when: str | None = None, delivery_ms: int = 0) -> DataFrame:
    """``key``, ``value`` and ``topic`` of the record each request row becomes (see the
    module doc); ``submit_when`` (a boolean column) picks the rows to submit (default:
    all); each submitted request carries ``delivery_ms`` (``answers.delivery_ms``). The
    answers query reads the values with :func:`~spark_ext.submit.submission.ack_schema`
    of ``requests``, as it reads a micro-batch submit query's acks.

    Usage::

        records = request_records(build_requests(events, tagging, template),
                                  pipeline_id="p1", requests_topic="llm.requests",
                                  acks_topic="llm.acks", attribute_columns=["event_id"])
    """
    submitted: Column = F.coalesce(F.col(submit_when), F.lit(False)) if submit_when \
        else F.lit(True)
    pairs: list[Column] = []
    for name in attribute_columns:
        pairs += [F.lit(name), F.col(name).cast("string")]
    for name, value in (extra_attributes or {}).items():
        pairs += [F.lit(name), F.lit(value)]
    attributes = F.create_map(*pairs) if pairs else F.create_map().cast("map<string,string>")
    columns = [F.col(c) for c in requests.columns]
    value = F.to_json(F.struct(
        *columns,
        F.when(submitted, F.lit(True)).alias("accepted"),
        F.when(submitted, F.lit(False)).alias("duplicate"),
        F.when(submitted, F.lit(ENDPOINT_PREFIX + requests_topic)).alias("endpoint"),
        F.when(submitted, attributes).alias("attributes"),
        F.when(submitted, F.lit(delivery_ms)).alias("delivery_ms"),
        F.lit(pipeline_id).alias(PIPELINE_FIELD)))
    return requests.select(
        F.col("request_id").alias("key"), value.alias("value"),
        F.when(submitted, F.lit(requests_topic)).otherwise(F.lit(acks_topic)).alias("topic"))
