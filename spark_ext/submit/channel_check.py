"""What the pipeline and its sidecars must agree on, compared where both are known: the
pipeline's start-up check asks every sidecar (from the executors' Python tasks) for its
stats, which name the result channel it writes to and the Kafka topic it reads requests
from. (The acks' place is the pipeline's own: its submit tasks write them and its answers
query reads them; no sidecar takes part.)"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spark_ext.exceptions import PipelineConfigError


def channel_mismatch(rows: Iterable[Mapping], result_channel: str) -> str | None:
    """One line naming both values when a serving sidecar writes its results to another
    channel than the pipeline reads (``None`` when every one that answered agrees). A
    sidecar that did not answer, or that does not say, is not judged here.

    Example:
        >>> channel_mismatch([{"endpoint": "127.0.0.1:50051", "serving": True,
        ...                    "result_channel": "kafka"}], "files")  # doctest: +ELLIPSIS
        "the sidecar at 127.0.0.1:50051 writes its results to the 'kafka' channel ..."
        >>> channel_mismatch([{"endpoint": "e", "serving": True, "result_channel": "files"},
        ...                   {"endpoint": "f", "serving": False, "result_channel": None}],
        ...                  "files") is None
        True
    """
    for row in rows:
        kind = row.get("result_channel")
        if row.get("serving") and kind and kind != result_channel:
            return (f"the sidecar at {row['endpoint']} writes its results to the {kind!r} "
                    f"channel (its results.kind) but this pipeline reads {result_channel!r} "
                    f"(sidecar.result_channel): set the sidecar's results.kind to "
                    f"{result_channel!r} or the pipeline's sidecar.result_channel to "
                    f"{kind!r}, else every request would end in the safety net's fallback")
    return None


def refuse_channel_mismatch(rows: Iterable[Mapping], result_channel: str) -> None:
    """Raise :class:`~spark_ext.exceptions.PipelineConfigError` with
    :func:`channel_mismatch`'s line when there is one."""
    if why := channel_mismatch(rows, result_channel):
        raise PipelineConfigError(why)


def intake_mismatch(rows: Iterable[Mapping], requests_topic: str) -> str | None:
    """One line naming both topics when a serving sidecar does not read the topic a
    pipeline whose submit query runs in Real-Time Mode writes its requests to (``None``
    when every one that answered reads it). A sidecar that does not say is not judged.

    Example:
        >>> intake_mismatch([{"endpoint": "e", "serving": True, "intake_topic": ""}],
        ...                 "llm.requests")  # doctest: +ELLIPSIS
        "the sidecar at e reads no requests topic (its intake.topic is empty) but ..."
        >>> intake_mismatch([{"endpoint": "e", "serving": True, "intake_topic": "a"}],
        ...                 "a") is None
        True
    """
    for row in rows:
        topic = row.get("intake_topic")
        if row.get("serving") and topic is not None and topic != requests_topic:
            reads = (f"reads requests from {topic!r} (its intake.topic)" if topic
                     else "reads no requests topic (its intake.topic is empty)")
            change = (f"set the sidecar's intake.topic to {requests_topic!r}"
                      + (f" or the pipeline's kafka.requests_topic to {topic!r}" if topic
                         else ""))
            return (f"the sidecar at {row['endpoint']} {reads} but this pipeline's submit "
                    f"query writes them to {requests_topic!r} (kafka.requests_topic, Real-Time "
                    f"Mode): {change}, else every request would end in the safety net's "
                    "fallback")
    return None


def refuse_intake_mismatch(rows: Iterable[Mapping], requests_topic: str) -> None:
    """Raise :class:`~spark_ext.exceptions.PipelineConfigError` with
    :func:`intake_mismatch`'s line when there is one."""
    if why := intake_mismatch(rows, requests_topic):
        raise PipelineConfigError(why)
