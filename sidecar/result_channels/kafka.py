"""The ``kafka`` result channel: one record per result row, on a topic per priority.

Each row (the terminal row of every request, and the late ``ok`` row of
``finish_and_backfill``) is produced to its request's ``callback_topic``, or to
``results.kafka.topic_template`` for its priority, keyed by ``request_id``, its value
the row as JSON (:mod:`sidecar.contract.result_json`). The producer is idempotent
(``enable.idempotence``, ``acks=all``) and waits for the brokers as long as they are
away (``message.timeout.ms=0``: librdkafka retries until they are back), so a broker
outage delays rows, never loses or duplicates them. What bounds the wait is memory:
at most ``max_buffered`` rows may be unacknowledged (librdkafka's
``queue.buffering.max.messages``), and admission refuses new requests
(``results_backlog``) before the rows that queued and running requests will write
would not fit (:meth:`KafkaResultChannel.room`).

Threads: :meth:`~KafkaResultChannel.emit` runs on the event loop and hands the row to
librdkafka at once (``produce`` never blocks; a row it cannot take yet waits in an
overflow list that the flush loop hands on). A small thread calls ``poll()``, which
serves the delivery reports and errors; it is the only writer of the delivered and
failed counts, the event loop the only writer of the produced count. At shutdown the
thread stops and ``flush()`` waits, at most the drain timeout, for what is left; rows
still unacknowledged then are logged with their count.

confluent-kafka is imported only when this channel is built (``pip install
'sts-spark[kafka]'``); without it, building the channel is a one-line config error.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any

from sidecar.config import KafkaChannelConfig
from sidecar.contract import PRIORITY_NAMES, encode_result, result_topic
from sidecar.contract.result_json import DEFAULT_PRIORITY
from sidecar.exceptions import ConfigError
from sidecar.request_state import ResultRecord
from sidecar.result_channels.base import ResultChannel, ResultChannelStats

logger = logging.getLogger(__name__)

#: Delivery errors logged one by one before only every :data:`_LOG_EVERY`-th is.
_LOG_FIRST = 10
_LOG_EVERY = 1000
#: How long the poll thread waits for events per call (seconds).
_POLL_S = 0.1
#: While the brokers are unreachable, they are asked for metadata this often (seconds).
_PROBE_EVERY_S = 5.0
#: How long one such probe waits for an answer (seconds).
_PROBE_TIMEOUT_S = 2.0
#: Default wait for the final flush when the caller gives none (seconds).
_CLOSE_TIMEOUT_S = 30.0


def _confluent_kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ConfigError("the kafka result channel needs confluent-kafka: "
                          "pip install 'sts-spark[kafka]' (results.kind)") from None
    return confluent_kafka


class KafkaResultChannel(ResultChannel):
    """Produces result rows to Kafka with an idempotent producer.

    Args:
        config: Brokers, topics, buffer bound and producer settings.
        sidecar_id: Part of the producer's ``client.id`` (unless the settings name one).
        flush_interval_s: How often rows librdkafka could not take yet are handed on.

    Raises:
        ConfigError: confluent-kafka is not installed, or librdkafka refuses the
            producer settings (one line).
    """

    kind = "kafka"
    bounded = True

    @classmethod
    def from_config(cls, config: Any, sidecar_id: str) -> "KafkaResultChannel":
        """From the ``results`` section: its ``kafka`` part and flush interval."""
        return cls(config.kafka, sidecar_id, flush_interval_s=config.flush_interval_s)

    def __init__(self, config: KafkaChannelConfig, sidecar_id: str, *,
                 flush_interval_s: float = 0.2) -> None:
        ck = _confluent_kafka()
        self.config = config
        self.reserve = config.reserve()
        self.flush_interval_s = flush_interval_s
        self._ck = ck
        """The confluent_kafka module (imported when the channel is built)."""
        settings = {"client.id": f"sts-sidecar-{sidecar_id}",
                    "logger": logging.getLogger(f"{__name__}.librdkafka"),
                    **config.producer_settings(),
                    "on_delivery": self._on_delivery, "error_cb": self._on_error}
        try:
            self._producer = ck.Producer(settings)
        except (ck.KafkaException, ValueError, TypeError) as e:
            raise ConfigError(f"the Kafka producer refused its settings: {_why(e)} "
                              "(results.kafka)") from None
        self._topics = {name: result_topic(config.topic_template, "", name)
                        for name in PRIORITY_NAMES}
        self._overflow: collections.deque[ResultRecord] = collections.deque()
        """Rows librdkafka could not take yet (its queue was full); handed on in order."""
        self.produced = 0
        """Rows handed to the channel (written on the event loop only)."""
        self.delivered = 0
        """Rows the brokers acknowledged (written by the poll thread only)."""
        self.delivery_errors = 0
        """Rows whose delivery failed for good (written by the poll thread only, or on
        the loop when ``produce`` refused a row, which the thread never sees)."""
        self._refused_on_loop = 0
        self.up: bool | None = None
        """Whether the brokers answer (``None`` until the first answer or failure)."""
        self._probed_at = 0.0
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self.on_written = None

    # ------------------------------------------------------------------ the event loop

    def start(self) -> None:
        """Start the poll thread (it first checks the brokers answer) and the loop that
        hands on what librdkafka could not take yet."""
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="sts-kafka-poll",
                                            daemon=True)
            self._poller.start()
        if self._task is None:
            self._task = asyncio.create_task(self._flush_loop(), name="kafka-results")

    def emit(self, record: ResultRecord) -> None:
        """Hand one row to the producer now (or, when librdkafka's queue is full, as
        soon as it has room). Never blocks."""
        self.produced += 1
        if self._overflow or not self._produce(record):
            self._overflow.append(record)
            self._wake.set()
        if self.on_written is not None:  # tracing: the row has left the sidecar
            self.on_written([record])

    def _produce(self, record: ResultRecord) -> bool:
        """Hand ``record`` to librdkafka; ``False`` when its queue is full (kept)."""
        topic = (record.callback_topic or self._topics.get(record.priority)
                 or self._topics[DEFAULT_PRIORITY])
        try:
            self._producer.produce(topic, encode_result(record),
                                   record.request_id.encode("utf-8"))
        except BufferError:
            return False
        except (self._ck.KafkaException, ValueError, TypeError) as e:
            # Refused for good (too large, a bad topic name, a fatal producer error):
            # counted and logged, as a failed delivery is.
            self._refused_on_loop += 1
            self._log_failure(record.request_id, topic, _why(e))
        return True

    def room(self) -> int:
        """Rows the channel can still take: ``max_buffered`` less the rows handed to it
        and not acknowledged (or failed) yet."""
        return self.config.max_buffered - self.buffered

    @property
    def buffered(self) -> int:
        """Rows handed to the channel and not acknowledged (nor failed) yet."""
        return self.produced - self.delivered - self.delivery_errors - self._refused_on_loop

    async def flush(self) -> None:
        """Hand the rows librdkafka could not take before to it, in order, while it
        takes them (acknowledgements come later, by the poll thread)."""
        while self._overflow and self._produce(self._overflow[0]):
            self._overflow.popleft()

    async def _flush_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()
            if self._overflow:  # librdkafka's queue is still full: no busy loop
                await asyncio.sleep(self.flush_interval_s)

    async def close(self, timeout_s: float | None = None) -> None:
        """Hand on what is left, stop the poll thread and wait, at most ``timeout_s``,
        until the brokers acknowledged every row; log how many are still not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if task := self._task:
            self._task = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if poller := self._poller:
            self._stop.set()
            await asyncio.to_thread(poller.join)
        deadline = time.monotonic() + (_CLOSE_TIMEOUT_S if timeout_s is None else timeout_s)
        await asyncio.to_thread(self._drain, deadline)
        if undelivered := self.buffered:
            logger.error("Kafka result channel closed with %d result rows not acknowledged "
                         "by the brokers (%s) after waiting %.1f s: they are not delivered; "
                         "the Spark side's safety net answers their requests.",
                         undelivered, self.config.bootstrap(),
                         _CLOSE_TIMEOUT_S if timeout_s is None else timeout_s)
        else:
            logger.info("Kafka result channel flushed: %d rows delivered, %d failed.",
                        self.delivered, self.delivery_errors + self._refused_on_loop)

    def _drain(self, deadline: float) -> None:
        """Off the loop, after the poll thread stopped (so one thread serves reports):
        hand on the overflow as librdkafka makes room, then flush until ``deadline``."""
        while time.monotonic() < deadline:
            while self._overflow and self._produce(self._overflow[0]):
                self._overflow.popleft()
            left = self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
            if not left and not self._overflow:
                return

    # ------------------------------------------------------------------ the poll thread

    def _poll_loop(self) -> None:
        self._probe()
        while not self._stop.is_set():
            self._producer.poll(_POLL_S)
            if self.up is False and time.monotonic() - self._probed_at >= _PROBE_EVERY_S:
                self._probe()

    def _probe(self) -> None:
        """Ask the brokers for metadata: whether they answer, logged when it changes."""
        self._probed_at = time.monotonic()
        try:
            metadata = self._producer.list_topics(timeout=_PROBE_TIMEOUT_S)
            answered = bool(metadata.brokers)
        except self._ck.KafkaException:
            answered = False
        self._set_up(answered, "no answer to a metadata request")

    def _set_up(self, up: bool, why: str) -> None:
        if up == self.up:
            return
        was, self.up = self.up, up
        if up:
            logger.info("Kafka result channel: brokers %s %s.", self.config.bootstrap(),
                        "answer again" if was is False else "answer")
        else:
            logger.warning("Kafka result channel: cannot reach the brokers %s (%s); result "
                           "rows wait in the producer (up to results.kafka.max_buffered="
                           "%d, then new requests are refused) until they are back.",
                           self.config.bootstrap(), why, self.config.max_buffered)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report of one row (served by ``poll``/``flush``)."""
        if err is None:
            self.delivered += 1
            if self.up is not True:
                self._set_up(True, "")
            return
        self.delivery_errors += 1
        key = msg.key()
        self._log_failure(key.decode("utf-8", "replace") if key else "?", msg.topic(),
                          _why(err))

    def _on_error(self, err: Any) -> None:
        """librdkafka's client-wide errors: brokers down, a fatal producer error."""
        if err.fatal():
            logger.error("Kafka result channel: the producer failed for good: %s; rows "
                         "can no longer be delivered (restart the sidecar).", err.str())
            self.up = False
        elif err.code() == self._ck.KafkaError._ALL_BROKERS_DOWN:
            self._set_up(False, err.str())
        else:
            logger.debug("Kafka result channel: %s", err.str())

    def _log_failure(self, request_id: str, topic: str, why: str) -> None:
        n = self.delivery_errors + self._refused_on_loop
        if n <= _LOG_FIRST or n % _LOG_EVERY == 0:
            logger.error("Kafka result channel: the result row of %s was not delivered to "
                         "%s: %s (%d failed so far).", request_id, topic, why, n)

    # ------------------------------------------------------------------ figures

    def stats(self) -> ResultChannelStats:
        return ResultChannelStats(kind=self.kind, produced=self.produced,
                                  delivered=self.delivered,
                                  delivery_errors=self.delivery_errors + self._refused_on_loop,
                                  buffered=self.buffered, up=self.up)

    @property
    def destination(self) -> str:
        return f"Kafka topics {self.config.topic_template!r} on {self.config.bootstrap()}"

    def summary(self) -> str:
        return (f"{self.delivered} results delivered to Kafka, "
                f"{self.delivery_errors + self._refused_on_loop} failed, "
                f"{self.buffered} not acknowledged")


def _why(error: Any) -> str:
    """The text of a confluent-kafka error (a ``KafkaError`` inside an exception)."""
    inner = error.args[0] if getattr(error, "args", None) else error
    text = inner.str() if hasattr(inner, "str") else str(inner)
    return " ".join(str(text).split())
