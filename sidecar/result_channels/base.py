"""The result channel interface: where the scheduler's result rows go.

A channel takes every result row the scheduler emits (terminal rows and the late
``ok`` rows of ``finish_and_backfill``) and makes it visible to readers: a Parquet
file in a landing folder (:mod:`sidecar.result_channels.files`) or a record on a
Kafka topic (:mod:`sidecar.result_channels.kafka`). Its life in the server::

    channel = build_result_channel(config.results, sidecar_id)
    channel.start()                      # inside the event loop
    channel.emit(record)                 # per row; never blocks, never drops
    channel.has_room(n)                  # admission: can it take n more rows?
    await channel.close(timeout_s)       # at shutdown: deliver what is buffered

A bounded channel (:attr:`ResultChannel.bounded`) holds at most a fixed number of rows
that are not delivered yet; the admission pipeline refuses new requests
(``results_backlog``) before their rows would not fit, keeping
:attr:`ResultChannel.reserve` rows for the rows of those refusals.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from sidecar.request_state import ResultRecord


@dataclass(frozen=True)
class ResultChannelStats:
    """Live figures of a result channel (``/metrics`` and ``GetStats``)."""

    kind: str
    """The channel kind (``files``, ``kafka``)."""

    produced: int
    """Rows handed to the channel since it started."""

    delivered: int
    """Rows readers can see: in a visible file, or acknowledged by the Kafka brokers."""

    delivery_errors: int
    """Failed deliveries: file writes that failed (their rows are retried), Kafka
    deliveries that failed for good (logged with their request ids)."""

    buffered: int
    """Rows handed to the channel and not delivered yet."""

    up: bool | None
    """Whether the destination is reachable (``None``: not known yet, or no such notion)."""


class ResultChannel(abc.ABC):
    """Where result rows go. All methods but the ``async`` ones are called on the event
    loop and return at once."""

    kind: ClassVar[str]
    """Its name in :data:`sidecar.kinds.RESULT_CHANNELS`."""

    @classmethod
    def from_config(cls, config: Any, sidecar_id: str) -> "ResultChannel":
        """The channel the ``results`` section describes (a ``ResultChannelConfig``),
        writing as ``sidecar_id``: what :func:`sidecar.result_channels.build_result_channel`
        calls on the registered class."""
        return cls(config, sidecar_id)  # type: ignore[call-arg]

    bounded: ClassVar[bool] = False
    """Whether :meth:`room` is finite (admission checks it only then)."""

    reserve: int = 0
    """Rows of :meth:`room` kept for the result rows of ``results_backlog`` refusals."""

    on_written: Callable[[list[ResultRecord]], None] | None = None
    """Called with rows once readers can see them (tracing); ``None``: nobody asks."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the background work (call inside the event loop)."""

    @abc.abstractmethod
    def emit(self, record: ResultRecord) -> None:
        """Take one result row. Never blocks and never drops a row: what cannot be
        handed on now is kept and handed on later."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Hand on what is pending now (a file, or records to the producer)."""

    @abc.abstractmethod
    async def close(self, timeout_s: float | None = None) -> None:
        """Deliver what is buffered (for at most ``timeout_s`` where delivery waits on
        a remote system; rows still undelivered then are logged with their count) and
        stop. Idempotent."""

    def room(self) -> int:
        """How many more rows the channel can take now (rows not yet delivered count
        against it). Unbounded channels answer ``sys.maxsize``."""
        return sys.maxsize

    def has_room(self, n: int = 1) -> bool:
        """Whether the channel can take ``n`` more rows now."""
        return self.room() >= n

    @abc.abstractmethod
    def stats(self) -> ResultChannelStats:
        """Live figures."""

    @property
    @abc.abstractmethod
    def destination(self) -> str:
        """Where rows go, for the start-up log line (a folder, topics on brokers)."""

    @abc.abstractmethod
    def summary(self) -> str:
        """One phrase for the shutdown log line (``"12 results in 3 files"``)."""
