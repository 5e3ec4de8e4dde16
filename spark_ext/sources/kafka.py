"""L0 from Kafka, with Spark's own Kafka source: events from a topic, and the results
topics the sidecar's ``kafka`` channel writes.

**Events.** A record's value is one JSON object with the fields of ``source.schema``;
its key is optional (``source.key_column`` names the event column it fills when the value
lacks it). A record that is empty, is not valid JSON for the schema (malformed, a field
of the wrong type) or misses a required field is **not dropped and does not stop the
query**: it keeps its raw bytes, topic, partition, offset and timestamp and the reason in
:data:`DEAD_LETTER_COLUMN`, is never submitted, and the pipeline writes it to the
``dead_letters`` table and counts it.

**Results.** The sidecar produces one JSON object per result row (the columns of
``sidecar.contract.RESULT_SCHEMA``), keyed by ``request_id``, to each request's
``callback_topic``; :func:`read_result_topics` reads those topics back with the same
columns as the files channel's reader.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sidecar.contract import now_ms as clock_ms
from spark_ext.config import PipelineConfig, SourceConfig
from spark_ext.sources.base import EventSource

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)

#: Event column holding why a record is not an event (``None`` for events).
DEAD_LETTER_COLUMN = "_sts_dead_letter"
#: Columns a dead-letter row carries besides the reason (null on events).
DEAD_LETTER_META = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp_ms",
                    "_kafka_key", "_kafka_value")
#: Spark's Kafka source's columns, as a DDL schema (the plan warm-up's one record).
KAFKA_RECORD_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset LONG, "
                    "timestamp TIMESTAMP, timestampType INT")
_CORRUPT = "_sts_corrupt_record"


def _reason(required: list[str]) -> Column:
    """Why a parsed record is not an event, or null."""
    reason = F.when(F.col("_kafka_value").isNull(), F.lit("empty record (no value)")) \
        .when(F.col(_CORRUPT).isNotNull(),
              F.lit("not a JSON object of the source schema (malformed, or a field of the "
                    "wrong type)"))
    for name in required:
        reason = reason.when(F.col(name).isNull(), F.lit(f"missing required field {name!r}"))
    return reason


def parse_events(records: DataFrame, config: SourceConfig, required: list[str]) -> DataFrame:
    """Spark Kafka source rows -> events with ``config.schema``'s columns plus
    :data:`DEAD_LETTER_COLUMN` and :data:`DEAD_LETTER_META` (set on dead letters only).

    Args:
        records: The Kafka source's DataFrame (``key``, ``value``, ``topic``, ...).
        config: The ``source`` section (``schema``, ``key_column``).
        required: Fields that must not be null (``source.required``, or the key columns
            and the template's fields).
    """
    ddl = f"{config.schema}, {_CORRUPT} STRING"
    meta = {"_kafka_topic": F.col("topic"), "_kafka_partition": F.col("partition"),
            "_kafka_offset": F.col("offset"),
            "_kafka_timestamp_ms": (F.unix_micros(F.col("timestamp")) / 1000).cast("long"),
            "_kafka_key": F.col("key"), "_kafka_value": F.col("value")}
    events = records.select(  # the event's own fields may be called key, topic, ...
        F.from_json(F.col("value").cast("string"), ddl,
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}).alias("_e"),
        *[value.alias(name) for name, value in meta.items()]).select("_e.*", *meta)
    if key := config.key_column:
        from_key = F.col("_kafka_key").cast("string")
        events = events.withColumn(key, F.coalesce(F.col(key), from_key)
                                   if key in events.columns else from_key)
    reason = _reason(required)
    events = events.withColumn(DEAD_LETTER_COLUMN, reason)
    for name in meta:  # kept for dead letters only
        events = events.withColumn(name, F.when(F.col(DEAD_LETTER_COLUMN).isNotNull(),
                                                F.col(name)))
    return events.drop(_CORRUPT)


class KafkaEventSource(EventSource):
    """Events from Kafka topics (``source.options``: ``subscribe``, ``subscribePattern`` or
    ``assign``, and any option of Spark's Kafka source) on the ``kafka`` section's
    cluster; records that are not events become dead letters (:func:`parse_events`)."""

    def read_stream(self, spark: SparkSession) -> DataFrame:
        """The records as events; a ``subscribe``d topic that does not exist is refused
        here, by name (the pipeline never creates a topic it reads events from)."""
        from spark_ext.exceptions import PipelineConfigError

        options = {**self.pipeline_config.kafka.spark_options(), **self.config.options}
        if topics := [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]:
            kafka = self.pipeline_config.kafka
            if missing := missing_topics(kafka.producer_config(), topics):
                raise PipelineConfigError(
                    f"source.options.subscribe: topic(s) {', '.join(missing)} do not exist on "
                    f"{kafka.producer_config().get('bootstrap.servers')}; create them first")
        records = spark.readStream.format("kafka").options(**options).load()
        return parse_events(records, self.config, self.required)

    def warm_up_events(self, spark: SparkSession, folder: str) -> DataFrame | None:
        """One record with every column null, parsed as the stream parses records."""
        record = spark.createDataFrame([(None,) * 7], KAFKA_RECORD_DDL)
        return parse_events(record, self.config, self.required)

    @property
    def has_dead_letters(self) -> bool:
        return True


def split_dead_letters(table: pa.Table, *, now_ms: int) -> tuple[pa.Table, pa.Table]:
    """A micro-batch's rows (Arrow) -> (events, dead-letter rows). The dead-letter rows
    are what the ``dead_letters`` table keeps: ``topic``, ``partition``, ``offset``,
    ``timestamp_ms``, ``key`` and ``value`` (the raw bytes), ``error`` and
    ``dead_lettered_ts``, with ``enqueue_ts`` = the record's timestamp (the tables'
    partitioning). Tables without the column are all events.

    Example:
        >>> import pyarrow as pa
        >>> t = pa.table({"event_id": ["e1", None], DEAD_LETTER_COLUMN: [None, "empty record"],
        ...               "_kafka_topic": [None, "ev"], "_kafka_partition": [None, 0],
        ...               "_kafka_offset": [None, 7], "_kafka_timestamp_ms": [None, 5],
        ...               "_kafka_key": [None, b"k"], "_kafka_value": [None, None]})
        >>> events, dead = split_dead_letters(t, now_ms=9)
        >>> events.column_names, dead.to_pylist()[0]["offset"], dead.to_pylist()[0]["error"]
        (['event_id'], 7, 'empty record')
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if DEAD_LETTER_COLUMN not in table.column_names:
        return table, pa.table({})
    dead = pc.is_valid(table.column(DEAD_LETTER_COLUMN))
    extra = [c for c in (DEAD_LETTER_COLUMN, *DEAD_LETTER_META) if c in table.column_names]
    events = table.filter(pc.invert(dead)).drop_columns(extra)
    bad = table.filter(dead)
    rows = pa.table({
        "topic": bad.column("_kafka_topic").cast(pa.string()),
        "partition": bad.column("_kafka_partition").cast(pa.int32()),
        "offset": bad.column("_kafka_offset").cast(pa.int64()),
        "timestamp_ms": bad.column("_kafka_timestamp_ms").cast(pa.int64()),
        "key": bad.column("_kafka_key").cast(pa.binary()),
        "value": bad.column("_kafka_value").cast(pa.binary()),
        "error": bad.column(DEAD_LETTER_COLUMN).cast(pa.string()),
        "dead_lettered_ts": pa.array([now_ms] * bad.num_rows, pa.int64()),
        "enqueue_ts": pc.fill_null(bad.column("_kafka_timestamp_ms").cast(pa.int64()), now_ms),
    })
    return events, rows


def kafka_lag(source: Any) -> dict[tuple[str, int], int]:
    """Records behind the newest per topic partition, from one source's progress (a
    ``SourceProgress`` of a ``StreamingQueryProgress``, or its dict in ``lastProgress``):
    ``latestOffset - endOffset``. Empty for a source that is not Kafka's.

    Example:
        >>> kafka_lag({"description": "KafkaV2[Subscribe[events]]",
        ...            "endOffset": '{"events": {"0": 5, "1": 9}}',
        ...            "latestOffset": '{"events": {"0": 12, "1": 9}}'})
        {('events', 0): 7, ('events', 1): 0}
    """
    import json

    def get(name: str) -> Any:
        return source.get(name) if isinstance(source, dict) else getattr(source, name, None)

    if not str(get("description") or "").startswith("Kafka"):
        return {}

    def offsets(value: Any) -> dict[tuple[str, int], int]:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return {}
        if not isinstance(value, dict):
            return {}
        return {(topic, int(part)): int(off) for topic, parts in value.items()
                if isinstance(parts, dict) for part, off in parts.items()}

    end, latest = offsets(get("endOffset")), offsets(get("latestOffset"))
    return {tp: max(0, latest[tp] - end.get(tp, 0)) for tp in sorted(latest)}


def result_topics_options(config: PipelineConfig, *, now_ms: int | None = None
                          ) -> dict[str, str]:
    """The Kafka source options of the answers query: the result topics of
    ``tagging.callback_topic`` (one per priority), and, for a new checkpoint, results
    from ``answers.ledger_horizon_s`` ago on (older ones cannot match a remembered
    request; a checkpoint that exists resumes from its own offsets).

    Example:
        >>> opts = result_topics_options(PipelineConfig(), now_ms=3_600_000 + 5)
        >>> opts["subscribe"], opts["startingTimestamp"]
        ('llm.result.high,llm.result.normal,llm.result.low', '5')
    """
    now = clock_ms() if now_ms is None else now_ms
    start = max(0, now - int(config.answers.ledger_horizon_s * 1000))
    return {**config.kafka.spark_options(),
            "subscribe": ",".join(config.result_topics()),
            "startingTimestamp": str(start),
            # a partition with nothing that new starts at its end, not with an error
            "startingOffsetsByTimestampStrategy": "latest"}


def _admin(producer_config: dict[str, str]) -> Any | None:
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return None
    return AdminClient(producer_config)


def missing_topics(producer_config: dict[str, str], topics: list[str], *,
                   timeout_s: float = 30.0) -> list[str] | None:
    """Those of ``topics`` the cluster does not have (``None``: cannot tell, confluent-kafka
    is not installed). Spark's Kafka source fails a query at once on a subscribed topic
    that does not exist, with a message that does not name it.

    Raises:
        PipelineConfigError: no broker answered.
    """
    from spark_ext.exceptions import PipelineConfigError

    if (admin := _admin(producer_config)) is None:
        return None
    try:
        have = set(admin.list_topics(timeout=timeout_s).topics)
    except Exception as e:  # noqa: BLE001 - KafkaException: no broker answered
        raise PipelineConfigError(f"cannot list the Kafka topics at "
                                  f"{producer_config.get('bootstrap.servers')}: {e}") from None
    return [t for t in topics if t not in have]


def ensure_topics(producer_config: dict[str, str], topics: list[str], *,
                  timeout_s: float = 30.0) -> list[str]:
    """Create those of ``topics`` the cluster does not have (its default partitions and
    replication); return the ones created. A result topic exists only once a sidecar
    has produced to it, and the answers query subscribes to it before that.

    Raises:
        PipelineConfigError: a topic is missing and could not be created (no rights, no
            broker): the message names it and says what to do.
    """
    from spark_ext.exceptions import PipelineConfigError

    missing = missing_topics(producer_config, topics, timeout_s=timeout_s)
    if missing is None:
        logger.warning("Cannot check the topics %s (confluent-kafka is missing: pip install "
                       "'sts-spark[kafka]'); the query fails if one does not exist.",
                       ", ".join(topics))
        return []
    if not missing:
        return []
    from confluent_kafka.admin import NewTopic

    admin, created = _admin(producer_config), []
    futures = admin.create_topics([NewTopic(t) for t in missing], request_timeout=timeout_s)
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(topic)
        except Exception as e:  # noqa: BLE001 - KafkaException
            if "TOPIC_ALREADY_EXISTS" in str(e) or "already exists" in str(e):
                continue  # made meanwhile (a sidecar's first result, another pipeline)
            raise PipelineConfigError(
                f"topic {topic!r} does not exist and could not be created ({e}); create "
                "it, or give the pipeline's Kafka user the right to") from None
    logger.info("Created the topic(s) %s.", ", ".join(created))
    return created


def read_result_topics(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The ``kafka`` result channel: the result topics read with Spark's Kafka source,
    each record's JSON value turned into the result columns (the files channel's
    schema). Result topics that do not exist yet are created first (:func:`ensure_topics`). A record that does not parse keeps only its ``request_id`` (the key) and
    ``status`` null; the answers query counts and skips it."""
    from sidecar.contract import RESULT_SCHEMA
    from spark_ext.schemas import spark_schema

    schema = spark_schema(RESULT_SCHEMA)
    ensure_topics(config.kafka.producer_config(), config.result_topics())
    records = spark.readStream.format("kafka").options(**result_topics_options(config)).load()
    row = F.from_json(F.col("value").cast("string"), schema)
    return records.select(row.alias("r"), F.col("key").cast("string").alias("_key")) \
        .select(*[F.coalesce(F.col("r.request_id"), F.col("_key")).alias(f.name)
                  if f.name == "request_id" else F.col(f"r.{f.name}") for f in schema.fields])


def read_channel_topics(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The ``kafka`` channel as the answers query reads it: the result topics and the
    acks topic (``sidecar.acks_topic``; with a real-time submit query also
    ``kafka.requests_topic``) in one source, each record as ``_topic``,
    ``_key`` and ``_value`` (strings). Topics that do not exist yet are created first
    (:func:`ensure_topics`). ``kafka.results_reader`` picks the reader: ``driver`` (one
    consumer on the driver, :mod:`spark_ext.sources.kafka_channel`) or ``spark``
    (Spark's Kafka source)."""
    topics = [*config.result_topics(), *config.channel_ack_topics()]
    ensure_topics(config.kafka.producer_config(), topics)
    options = {**result_topics_options(config), "subscribe": ",".join(topics)}
    if config.kafka.results_reader == "driver":
        import json

        from spark_ext.sources.kafka_channel import SOURCE_NAME, register_kafka_channel_source

        register_kafka_channel_source(spark)
        return (spark.readStream.format(SOURCE_NAME)
                .option("topics", options["subscribe"])
                .option("clientConfigSecret", json.dumps(config.kafka.producer_config()))
                .option("startingTimestamp", options["startingTimestamp"]).load())
    records = spark.readStream.format("kafka").options(**options).load()
    return records.select(F.col("topic").alias("_topic"),
                          F.col("key").cast("string").alias("_key"),
                          F.col("value").cast("string").alias("_value"))
