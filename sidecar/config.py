"""Configuration of the sidecar: one dataclass per concern, loadable from YAML.

Every field has a default and a docstring. Checks run in ``__post_init__`` and
raise :class:`ValueError` naming the field and the offending value.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from sidecar.config_files import as_dataclass, build_sections, read_yaml
from sidecar.contract import PRIORITY_NAMES
from sidecar.event_loop import EVENT_LOOPS
from sidecar.exceptions import ConfigError, SidecarConfigError, one_line
from sidecar.kinds import ENGINES, RESULT_CHANNELS

DeadlinePolicy = Literal["abort", "finish_and_backfill"]


@dataclass
class EngineConfig:
    """Which engine serves generation and how it is started."""

    kind: str = ENGINES.default
    """A name in :data:`sidecar.kinds.ENGINES`: ``vllm`` (vLLM ``AsyncLLM`` in process, the
    default) or ``simulated`` (timing model, load tests only)."""

    model: str | None = None
    """Path of the model folder. ``None`` means the prepared SmolLM2 (``sts model prepare``)."""

    served_model_name: str | None = None
    """Name requests use in their ``model`` field; defaults to the model folder's name."""

    apply_chat_template: bool = True
    """Wrap each prompt as the user turn of the model's chat template (instruct models)."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.AsyncEngineArgs`` (e.g. ``max_num_seqs``)."""

    simulated: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for :class:`sidecar.engines.simulated.SimulatedEngineConfig`."""

    ignore_eos: bool = False
    """Load tests only: every answer runs to its ``max_tokens`` (vLLM's ``ignore_eos``, as
    vLLM's own serving benchmark sets it), so a replayed trace keeps its output lengths.
    The simulated engine always does; ``sts bench --trace --engine vllm`` sets it."""

    def __post_init__(self) -> None:
        ENGINES.check(self.kind)
        if not isinstance(self.ignore_eos, bool):
            raise SidecarConfigError(
                f"engine.ignore_eos={self.ignore_eos!r} must be true or false")


@dataclass
class PoolConfig:
    """Limits of one priority pool (``high``, ``normal`` or ``low``).

    A request of the pool waits in the pool's queue until the dispatcher picks
    the pool (see :class:`sidecar.pools.WeightedPicker`) and the pool has room
    in the engine: fewer than ``max_in_flight`` requests and at most
    ``max_tokens_in_flight`` tokens (prompt plus ``max_tokens``) running.
    """

    max_queued: int = 1000
    """Most requests waiting in this pool. Past it, arrivals are shed (``queue_full``)."""

    max_in_flight: int = 8
    """Most requests of this pool inside the engine at once."""

    max_queue_delay_ms: int = 10_000
    """Longest a request of this pool waits in its queue unless its own deadline shows
    it can wait longer. An arrival whose estimated wait is longer, and a queued request
    that has waited this long, is shed (``queue_delay_exceeded``) only when its
    ``deadline_ts`` does not leave room for that wait (the rest of it, once queued) plus
    its measured service time at the full batch, times ``deadline_slack``; otherwise
    it waits on, until it starts, its deadline passes (``timeout``), or at the head of
    the queue it can no longer finish (``deadline_infeasible``). Why: the deadline is
    the caller's own word on how long an answer stays useful, and a fallback is a worse
    answer than an on-time generated one, so a bound shorter than the deadline must not
    turn work away that will finish in time. The estimated wait counts only once a
    request has completed: before that the service time assumes every answer uses all
    of ``max_tokens``, the wait is an upper bound, and no arrival is refused on it.
    While the engine's speed is unknown (no calibration, nothing finished) this is a
    plain cap on the time queued."""

    max_tokens_in_flight: int = 1 << 20
    """Most prompt plus ``max_tokens`` tokens of this pool inside the engine at once
    (a lone request larger than this still runs when the pool is otherwise idle)."""

    weight: int = 1
    """Share of dispatch slots when several pools have work (smooth weighted
    round robin); a pool with weight 1 next to one with weight 8 still gets 1 in 9."""

    fallback_text: str = "Thanks for your message. An agent will get back to you shortly."
    """Rule fallback answer carried by every refusal and non-``ok`` result of this pool."""

    on_deadline: DeadlinePolicy = "abort"
    """What happens to a request still generating at its ``deadline_ts``. ``abort``:
    it is aborted in the engine and ends ``timeout``. ``finish_and_backfill``: its
    ``timeout`` row (with ``fallback_text``) is written at the deadline all the
    same, but generation goes on as late work while no on-time request needs its
    engine slot; if it completes, one more row follows (``ok``, ``late`` true)
    that the reader uses to backfill the fallback answer. Requests still queued at
    their deadline time out without engine work under either policy."""

    DEADLINE_POLICIES: ClassVar[tuple[str, ...]] = ("abort", "finish_and_backfill")

    def __post_init__(self) -> None:
        for name in ("max_queued", "max_in_flight", "max_queue_delay_ms",
                     "max_tokens_in_flight", "weight"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SidecarConfigError(f"pool {name}={value!r} must be a positive integer")
        if self.on_deadline not in self.DEADLINE_POLICIES:
            raise SidecarConfigError(f"pool {self.on_deadline=} must be one of "
                             f"{self.DEADLINE_POLICIES}")


def _default_pools() -> dict[str, PoolConfig]:
    # normal 5 + low 2 = 7 < the default engine's 8: one slot is never held by lower work,
    # and normal + low together leave the batch small enough for a fast `high` answer
    # (docs/scheduling.md, "Worked example").
    return {
        "high": PoolConfig(max_queued=2000, max_in_flight=8, max_queue_delay_ms=2000, weight=8),
        "normal": PoolConfig(max_queued=5000, max_in_flight=5, max_queue_delay_ms=10_000,
                             weight=3),
        "low": PoolConfig(max_queued=10_000, max_in_flight=2, max_queue_delay_ms=60_000,
                          weight=1),
    }


@dataclass
class PreemptionConfig:
    """When higher-priority work may take engine slots from running lower-priority work.

    A preempted request is aborted in the engine, its partial output is dropped, and it
    goes back to the front of its pool's queue with its deadline unchanged; it starts
    again from the beginning later. The victim is the running request of the lowest
    priority with the most work left (expected tokens still to generate).
    """

    enabled: bool = True
    """Preempt at all (``False``: a request waits for a slot to free)."""

    max_per_request: int = 2
    """A request preempted this many times is not preempted again (it runs to its end)."""

    immediate: list[str] = field(default_factory=lambda: ["high"])
    """Priorities whose queue head preempts lower work as soon as it cannot start (``high``
    never waits behind ``low`` for a slot). The other priorities above ``low`` preempt
    only when the head would miss its deadline waiting for a slot."""

    shrink_batch: bool = True
    """When a request can meet its deadline only in a smaller batch (decode speed per
    sequence falls as the batch grows), preempt and hold back lower-priority work so the
    batch stays that small while it runs, instead of refusing it as infeasible."""

    hold_lower: bool = False
    """Experimental, off by default. When a running request falls behind its deadline at
    its own decode speed but would meet it at the speed the warm-up measured (no other
    prompt prefilled between its decode steps), halve the number of sequences the engine
    may hold when lower-priority work starts; each on-time finish of a higher priority
    widens it by a sixteenth again (:mod:`sidecar.intake_window`). A request late at the
    engine's present speed but in time at that speed is admitted and narrows them too.
    Nothing is preempted for it. Measured on ten simulated GPUs at 200 requests/s: on the
    Azure coding trace ``high`` in time alone went from 13 % to 35 % of its requests, for
    total goodput 53 % -> 46 %; on the seed profile nothing changed (92 %)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_per_request, int) or self.max_per_request < 0:
            raise SidecarConfigError(f"preemption.max_per_request={self.max_per_request!r} must be "
                             "an integer >= 0")
        if bad := [p for p in self.immediate if p not in ("high", "normal")]:
            raise SidecarConfigError(f"preemption.immediate={self.immediate!r}: {bad} cannot preempt "
                             "(only 'high' and 'normal' have lower work to preempt)")


@dataclass
class LoadSheddingConfig:
    """Watermarks past which whole priorities are shed (``overloaded``).

    Keys are ``low`` and ``normal``; ``high`` is never shed by a watermark, only
    when its own pool is full. When the total queue depth (all pools) reaches
    ``queue_depth[p]``, or the tokens in the engine reach ``tokens_in_flight[p]``,
    new requests of priority ``p`` are shed, and queued ones of ``p`` are shed
    (newest first) until the depth is back under the watermark. Give ``low`` the
    lower watermarks so it is shed first.

    Counts do not say how long a queue is on a given engine (twenty requests are a
    second on a GPU and half a minute on a slow CPU), so there is also a watermark in
    outcomes: a pool is *losing* while one of its requests timed out in its queue, or
    was refused for a wait it could not afford (``queue_delay_exceeded``,
    ``deadline_infeasible`` where it would have fit with no wait), within the last
    ``pressure_window_s``. While a higher pool is losing, new requests of the
    priorities in ``under_pressure`` are shed at once (``overloaded``: the rule fallback
    now rather than a wait the engine cannot give). A ``low`` request admitted instead
    would wait out the burst on its longer deadline and be served after it, taking the
    engine's share that ``normal`` lacked: the order of the pools' answers would invert.
    """

    queue_depth: dict[str, int] = field(
        default_factory=lambda: {"low": 2000, "normal": 6000})
    """Total queued requests at which each priority is shed."""

    tokens_in_flight: dict[str, int] = field(
        default_factory=lambda: {"low": 1 << 30, "normal": 1 << 30})
    """Total prompt plus ``max_tokens`` tokens in the engine at which each priority is shed."""

    under_pressure: list[str] = field(default_factory=list)
    """Priorities shed at arrival while a higher pool is losing requests to waiting
    (``[]``, the default: never; ``[low]``: ``low`` while ``normal`` or ``high`` loses;
    ``[normal, low]``: ``normal`` too while ``high`` loses)."""

    pressure_window_s: float = 5.0
    """How long after a pool's last request lost to waiting it counts as losing."""

    def __post_init__(self) -> None:
        if not isinstance(self.under_pressure, list):  # "[low]" on --set is not JSON
            raise SidecarConfigError(f"load_shedding.under_pressure={self.under_pressure!r} "
                                     'must be a list of priorities, e.g. ["low"]')
        if bad := [p for p in self.under_pressure if p not in ("low", "normal")]:
            raise SidecarConfigError(f"load_shedding.under_pressure={self.under_pressure!r}: "
                                     f"{bad} cannot be shed (only 'normal' and 'low')")
        if not isinstance(self.pressure_window_s, (int, float)) or self.pressure_window_s <= 0:
            raise SidecarConfigError(f"load_shedding.pressure_window_s={self.pressure_window_s!r} "
                                     "must be a positive number of seconds")
        for name in ("queue_depth", "tokens_in_flight"):
            marks = getattr(self, name)
            if set(marks) - {"low", "normal"}:
                raise SidecarConfigError(f"load_shedding.{name} keys must be 'low' and 'normal', "
                                 f"got {sorted(marks)}")
            for key, value in marks.items():
                if not isinstance(value, int) or value < 1:
                    raise SidecarConfigError(f"load_shedding.{name}.{key}={value!r} must be a "
                                     "positive integer")
            if "low" in marks and "normal" in marks and marks["low"] > marks["normal"]:
                raise SidecarConfigError(f"load_shedding.{name}: low ({marks['low']}) must not exceed "
                                 f"normal ({marks['normal']}); low is shed first")


@dataclass
class SchedulerConfig:
    """Admission limits, priority pools and dispatch into the engine."""

    max_in_flight: int = 8
    """Most requests handed to the engine at once (all pools). Keep it at the engine's
    ``max_num_seqs`` so a dispatched request never waits inside the engine."""

    pools: dict[str, PoolConfig] = field(default_factory=_default_pools)
    """One :class:`PoolConfig` per priority; a pool left out of the YAML keeps its defaults."""

    load_shedding: LoadSheddingConfig = field(default_factory=LoadSheddingConfig)
    """Watermarks that shed ``low`` first, then ``normal``."""

    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    """Whether and when higher-priority work preempts running lower-priority work."""

    deadline_admission: bool = True
    """Refuse (``deadline_infeasible``) requests whose estimated completion is after
    their deadline, at admission and again when they reach the front of the queue.
    Until a request has completed, the estimate counts the service time alone (the
    wait it would add is an upper bound, see ``PoolConfig.max_queue_delay_ms``)."""

    deadline_slack: float = 1.0
    """Multiplier on the estimated wait plus service time in the feasibility test and in
    the test that lets a request wait past its pool's ``max_queue_delay_ms`` (above 1
    is more cautious, below 1 admits more)."""

    delivery_ms: int = 0
    """Time a result takes, after the sidecar writes it, to become the caller's answer
    (the pipeline's *finished -> answer landed*: its result channel, its answers
    micro-batch, its table commit; a P90 is a good value). The batch a request starts
    in and the catch-up of a running one aim to finish this long before its deadline
    where a smaller batch gets it there, so its answer lands by the deadline.
    Refusals, the timeout and the terminal row keep the deadline itself. 0: plan for
    the deadline. A request may carry its own (``InferenceRequest.delivery_ms``: the
    pipeline sends its ``answers.delivery_ms``); the larger of the two counts."""

    target_utilisation: float = 0.7
    """The share of a GPU's measured capacity the scale signal plans to use
    (``desired_gpus`` on ``/metrics`` and ``GetStats``; the capacity formula's 0.6-0.75
    leaves room for bursts)."""

    max_tokens_cap: int = 2048
    """Largest ``max_tokens`` a request may ask for."""

    max_prompt_tokens: int = 4096
    """Largest prompt, in tokens after the chat template."""

    max_prompt_chars: int = 65_536
    """Largest prompt in characters (checked before tokenizing)."""

    dedupe_window: int = 1_000_000
    """How many recent ``request_id`` values are remembered to drop replays."""

    drain_timeout_s: float = 60.0
    """On SIGTERM, how long in-flight and queued requests may run before they are aborted."""

    engine_check_interval_s: float = 1.0
    """How often a watchdog asks the engine whether it still serves (it is also asked
    before every admitted batch). A dead engine turns the sidecar ``NOT_SERVING``."""

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_tokens_cap", "max_prompt_tokens",
                     "max_prompt_chars", "dedupe_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SidecarConfigError(f"self.{name}={value!r} must be a positive integer")
        if self.drain_timeout_s < 0:
            raise SidecarConfigError(f"{self.drain_timeout_s=} must be >= 0")
        if not 0 < self.engine_check_interval_s <= 60:
            raise SidecarConfigError(f"{self.engine_check_interval_s=} must be in (0, 60]")
        if not 0 < self.deadline_slack <= 10:
            raise SidecarConfigError(f"{self.deadline_slack=} must be in (0, 10]")
        if not isinstance(self.delivery_ms, int) or not 0 <= self.delivery_ms <= 600_000:
            raise SidecarConfigError(f"{self.delivery_ms=} must be an integer in [0, 600000]")
        if not 0 < self.target_utilisation <= 1:
            raise SidecarConfigError(f"{self.target_utilisation=} must be in (0, 1]")
        if unknown := set(self.pools) - set(PRIORITY_NAMES):
            raise SidecarConfigError(f"unknown pools {sorted(unknown)}; pools are {PRIORITY_NAMES}")
        defaults = _default_pools()
        self.pools = {
            name: as_dataclass(PoolConfig, self.pools.get(name, {}),
                                f"scheduler.pools.{name}", base=defaults[name])
            for name in PRIORITY_NAMES
        }
        self.load_shedding = as_dataclass(LoadSheddingConfig, self.load_shedding,
                                           "scheduler.load_shedding")
        self.preemption = as_dataclass(PreemptionConfig, self.preemption, "scheduler.preemption")


@dataclass
class KafkaChannelConfig:
    """The ``kafka`` result channel: one record per result row, on a topic per priority.

    The producer is idempotent (``enable.idempotence``, ``acks=all``) and never gives up
    on a row because the brokers are away (``message.timeout.ms=0``: librdkafka retries
    until they are back); the buffer of rows not yet acknowledged is bounded by
    ``max_buffered`` instead, and admission refuses new requests (``results_backlog``)
    before their rows would not fit.
    """

    bootstrap_servers: str | None = None
    """``host:port[,host:port...]`` of the brokers (shortcut for
    ``producer["bootstrap.servers"]``; one of the two is required)."""

    topic_template: str = "llm.result.{priority}"
    """Topic of a row whose request has no ``callback_topic``: ``{priority}`` becomes the
    request's priority (``high``, ``normal``, ``low``; ``normal`` for a row without a
    known priority, e.g. a request rejected for its priority)."""

    max_buffered: int = 100_000
    """Most rows handed to the producer and not yet acknowledged by the brokers
    (librdkafka's ``queue.buffering.max.messages``). Admission counts the rows queued
    and running requests will still write against it."""

    refusal_reserve: int | None = None
    """Rows of ``max_buffered`` kept for the result rows of ``results_backlog``
    refusals (``None``: a tenth of ``max_buffered``); once those are used up too, a
    refusal is answered in its ack alone."""

    producer: dict[str, Any] = field(default_factory=dict)
    """Further confluent-kafka producer settings, passed through as they are
    (``security.protocol``, ``sasl.*``, ``ssl.*``, ``linger.ms``, ``compression.type``,
    ``message.timeout.ms``, ...). The ones the channel's guarantees rest on
    (:attr:`FIXED`) cannot be changed."""

    FIXED: ClassVar[dict[str, Any]] = {"enable.idempotence": True, "acks": "all"}
    """Producer settings the channel always uses: no duplicate and no reordering on
    retries, and a row counts as delivered only once every in-sync replica has it."""

    def __post_init__(self) -> None:
        if not isinstance(self.producer, dict) or not all(isinstance(k, str)
                                                          for k in self.producer):
            raise SidecarConfigError(f"results.kafka.producer={self.producer!r} must be a mapping "
                             "of confluent-kafka settings")
        for key, value in self.FIXED.items():
            if key in self.producer and str(self.producer[key]).lower() not in (
                    str(value).lower(), "-1" if key == "acks" else ""):
                raise SidecarConfigError(f"results.kafka.producer[{key!r}]={self.producer[key]!r}: "
                                 f"the result channel always uses {key}={value}")
        for key in ("queue.buffering.max.messages", "on_delivery", "error_cb"):
            if key in self.producer:
                raise SidecarConfigError(f"results.kafka.producer[{key!r}] is set by the channel "
                                 "(use results.kafka.max_buffered for the buffer)")
        given = self.producer.get("bootstrap.servers")
        if self.bootstrap_servers is not None and not (
                isinstance(self.bootstrap_servers, str) and self.bootstrap_servers.strip()):
            raise SidecarConfigError(f"results.kafka.{self.bootstrap_servers=} must be host:port[,...]")
        if given is not None and self.bootstrap_servers and given != self.bootstrap_servers:
            raise SidecarConfigError(f"results.kafka.bootstrap_servers={self.bootstrap_servers!r} and "
                             f"results.kafka.producer['bootstrap.servers']={given!r} differ")
        if not isinstance(self.topic_template, str) or not self.topic_template.strip():
            raise SidecarConfigError(f"results.kafka.{self.topic_template=} must be a topic name")
        try:
            self.topic_template.format(priority="normal")
        except (KeyError, IndexError, ValueError) as e:
            raise SidecarConfigError(f"results.kafka.{self.topic_template=} may only use "
                             f"{{priority}} ({e})") from None
        for name in ("max_buffered", "refusal_reserve"):
            value = getattr(self, name)
            if value is None and name == "refusal_reserve":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SidecarConfigError(f"results.kafka.{name}={value!r} must be a positive integer")
        if self.reserve() >= self.max_buffered:
            raise SidecarConfigError(f"results.kafka.refusal_reserve={self.refusal_reserve} must be "
                             f"less than max_buffered={self.max_buffered}")

    def reserve(self) -> int:
        """The rows kept for refusal rows (:attr:`refusal_reserve` or its default).

        Example:
            >>> KafkaChannelConfig().reserve(), KafkaChannelConfig(refusal_reserve=50).reserve()
            (10000, 50)
        """
        if self.refusal_reserve is not None:
            return self.refusal_reserve
        return max(1, self.max_buffered // 10) if self.max_buffered > 1 else 0

    def bootstrap(self) -> str | None:
        """The brokers to connect to (``bootstrap_servers`` or the producer's own)."""
        return self.bootstrap_servers or self.producer.get("bootstrap.servers") or None

    def producer_settings(self) -> dict[str, Any]:
        """The confluent-kafka producer configuration (without callbacks).

        Example:
            >>> cfg = KafkaChannelConfig(bootstrap_servers="127.0.0.1:9092", max_buffered=500)
            >>> s = cfg.producer_settings()
            >>> s["bootstrap.servers"], s["enable.idempotence"], s["message.timeout.ms"]
            ('127.0.0.1:9092', True, 0)
            >>> s["queue.buffering.max.messages"]
            500
        """
        settings: dict[str, Any] = {"message.timeout.ms": 0, **self.producer, **self.FIXED,
                                    "queue.buffering.max.messages": self.max_buffered}
        if bootstrap := self.bootstrap():
            settings["bootstrap.servers"] = bootstrap
        return settings


@dataclass
class ResultChannelConfig:
    """Where result rows go."""

    kind: str = RESULT_CHANNELS.default
    """A name in :data:`sidecar.kinds.RESULT_CHANNELS`. ``files`` (the default):
    Parquet files appended atomically to ``results_dir``; ``kafka``: records on a topic
    per priority (the ``kafka`` section; needs ``pip install 'sts-spark[kafka]'``)."""

    results_dir: str = "./sts-results"
    """Landing directory read by Spark's file source (``files``)."""

    flush_interval_s: float = 0.2
    """Pending results are written (``files``) or handed to the producer (``kafka``) at
    least this often (seconds)."""

    max_rows_per_file: int = 10_000
    """A file is written as soon as this many results are pending (``files``)."""

    kafka: KafkaChannelConfig = field(default_factory=KafkaChannelConfig)
    """The ``kafka`` channel's brokers, topics, buffer and producer settings."""

    def __post_init__(self) -> None:
        RESULT_CHANNELS.check(self.kind)
        if not 0 < self.flush_interval_s <= 0.2:
            raise SidecarConfigError(f"{self.flush_interval_s=} must be in (0, 0.2]")
        if self.max_rows_per_file < 1:
            raise SidecarConfigError(f"{self.max_rows_per_file=} must be >= 1")
        self.kafka = as_dataclass(KafkaChannelConfig, self.kafka, "results.kafka")
        if self.kind == "kafka" and not self.kafka.bootstrap():
            raise SidecarConfigError("results.kind=kafka needs results.kafka.bootstrap_servers (or "
                             "results.kafka.producer['bootstrap.servers'])")


@dataclass
class IntakeConfig:
    """Requests read from a Kafka topic, besides the ``SubmitBatch`` RPC (off unless
    ``topic`` is set): what a pipeline whose submit query runs in Spark's Real-Time Mode
    writes (``output.triggers.submit: realtime``, the pipeline's ``kafka.requests_topic``),
    since that mode runs no Python between Kafka and Kafka without delay.

    Each record is one request as JSON (the fields of ``InferenceRequest``, ``priority``
    by name, ``attributes`` a mapping); it is admitted exactly as ``SubmitBatch`` admits
    it, a refusal is its request's result row (there is no ack to send back), a record
    read again after a restart or a rebalance is a duplicate (the de-duplication window)
    and gets no second row. Sidecars sharing ``group_id`` share the topic's partitions.
    The intake starts once the sidecar serves and stops first when it drains, so records
    it has not read stay for the group's other sidecars."""

    topic: str = ""
    """The requests topic; empty: no Kafka intake."""

    group_id: str = "sts-sidecars"
    """Kafka consumer group of the sidecars that share the topic."""

    bootstrap_servers: str | None = None
    """``host:port[,...]`` of the brokers; default: ``results.kafka``'s."""

    max_records: int = 500
    """Most records admitted in one step (what is already fetched is admitted at once;
    the intake never waits to fill a step)."""

    consumer: dict[str, Any] = field(default_factory=dict)
    """Further confluent-kafka consumer settings (``security.protocol``, ``sasl.*``,
    ``auto.offset.reset``: ``earliest`` by default, so requests written before a sidecar
    joined are read)."""

    FIXED: ClassVar[dict[str, Any]] = {"enable.auto.offset.store": False,
                                       "enable.auto.commit": True}
    """Consumer settings the intake relies on: an offset is stored only once its record
    was admitted, and stored offsets are committed in the background."""

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str):
            raise SidecarConfigError(f"intake.{self.topic=} must be a topic name")
        if self.topic and not (isinstance(self.group_id, str) and self.group_id.strip()):
            raise SidecarConfigError(f"intake.{self.group_id=} must be a consumer group name")
        if not isinstance(self.max_records, int) or isinstance(self.max_records, bool) \
                or self.max_records < 1:
            raise SidecarConfigError(f"intake.{self.max_records=} must be a positive integer")
        if not isinstance(self.consumer, dict):
            raise SidecarConfigError(f"intake.consumer={self.consumer!r} must be a mapping of "
                                     "confluent-kafka settings")
        if fixed := sorted(set(self.consumer) & {*self.FIXED, "group.id"}):
            raise SidecarConfigError(f"intake.consumer[{fixed[0]!r}] is set by the intake")

    def consumer_settings(self, bootstrap: str) -> dict[str, Any]:
        """The confluent-kafka consumer configuration.

        Example:
            >>> s = IntakeConfig(topic="llm.requests").consumer_settings("127.0.0.1:9092")
            >>> s["group.id"], s["auto.offset.reset"], s["enable.auto.offset.store"]
            ('sts-sidecars', 'earliest', False)
        """
        return {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                **self.consumer, **self.FIXED, "group.id": self.group_id}


@dataclass
class OwnerConfig:
    """The process a sidecar serves (``server.owner``): a lazily started sidecar goes
    away with its executor, once that is gone for good (scale-in), after draining."""

    file: str | None = None
    """File holding the pid of the process this sidecar serves (``launch: lazy`` writes
    its executor's there; a replacement executor on the same GPU writes its own).
    ``None``: the sidecar serves until it is stopped."""

    exit_after_s: float = 60.0
    """How long the owner may be gone (the file names no running process) before the
    sidecar drains as on SIGTERM (new requests refused ``draining``, queued and running
    ones finished by their deadlines, results delivered) and exits 0, which frees its
    GPU: long enough for a replacement executor to take the sidecar over."""

    def __post_init__(self) -> None:
        if not isinstance(self.exit_after_s, (int, float)) or self.exit_after_s < 0:
            raise SidecarConfigError(f"server.owner.exit_after_s={self.exit_after_s!r} must "
                                     "be >= 0 seconds")


@dataclass
class ServerConfig:
    """The gRPC endpoint."""

    listen: str = "127.0.0.1:50051"
    """``host:port`` (loopback) or ``unix:///path/to.sock``."""

    sidecar_id: str | None = None
    """Identity written into every result and result file name; defaults to
    ``<hostname>-<pid>``. Must not contain ``/``."""

    max_message_mb: int = 64
    """Largest gRPC message (a submitted batch), in MiB."""

    max_inflight_rpc_mb: int = 256
    """Most request bytes being parsed and handled at once, all calls together, in MiB;
    a call that would pass it is answered ``RESOURCE_EXHAUSTED`` at once (parsed
    requests take several times their wire size)."""

    submit_yield_ms: float = 5.0
    """Longest one ``SubmitBatch`` admits requests before it yields the event loop: a
    100,000-request batch is admitted in steps, and health checks and other RPCs
    answer in between."""

    shutdown_grace_s: float = 5.0
    """Grace period for open RPCs when the server stops."""

    event_loop: str = "auto"
    """Event loop of ``sts sidecar``: ``uvloop`` (a tenth less CPU per request),
    ``asyncio``, or ``auto`` (uvloop where installed, else asyncio)."""

    log_requests: bool = False
    """Log every admitted and finished request (debugging)."""

    metrics_port: int | None = None
    """Serve Prometheus ``/metrics`` on this port (``None``: no endpoint)."""

    metrics_addr: str = "127.0.0.1"
    """Address of the metrics endpoint (``0.0.0.0`` to let a remote Prometheus scrape)."""

    metrics_gpus: list[int | str] | None = None
    """GPUs whose utilisation and memory ``/metrics`` reports (NVML indices or
    ``GPU-...`` UUIDs; needs ``nvidia-ml-py``). ``None``: those in
    ``CUDA_VISIBLE_DEVICES``, else every GPU of the host; ``[]``: none."""

    tls_cert_file: str | None = None
    """PEM certificate chain of the server; with ``tls_key_file`` the port speaks TLS only."""

    tls_key_file: str | None = None
    """PEM private key of ``tls_cert_file``."""

    tls_client_ca_file: str | None = None
    """PEM CA bundle for client certificates: set it to require mutual TLS."""

    token_file: str | None = None
    """File holding the bearer token every RPC but health must carry
    (``authorization: Bearer <token>``). Never on the command line."""

    token_env: str | None = None
    """Environment variable holding the bearer token (used when ``token_file`` is unset)."""

    allow_insecure_remote: bool = False
    """Allow a non-loopback TCP address without TLS or a token (labs only): anyone who
    reaches the port can then use the GPU."""

    socket_mode: int = 0o660
    """Permissions of a unix socket (``0o660``: owner and group may connect). Its
    directory is created ``0o750`` if missing and must be owned by the sidecar's user."""

    engine_death_grace_s: float = 2.0
    """After the engine died, how long the sidecar keeps answering (health
    ``NOT_SERVING``, requests refused ``engine_unavailable``) before it exits non-zero."""

    owner: OwnerConfig = field(default_factory=OwnerConfig)
    """The process this sidecar serves; it drains and exits once that is gone."""

    def __post_init__(self) -> None:
        if self.sidecar_id is not None and (not self.sidecar_id or "/" in self.sidecar_id):
            raise SidecarConfigError(f"{self.sidecar_id=} must be non-empty and contain no '/'")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise SidecarConfigError(f"{self.metrics_port=} must be a TCP port")
        if self.metrics_gpus is not None and (
                not isinstance(self.metrics_gpus, list)
                or not all(isinstance(g, (int, str)) and not isinstance(g, bool)
                           for g in self.metrics_gpus)):
            raise SidecarConfigError(f"{self.metrics_gpus=} must be a list of GPU indices or UUIDs")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise SidecarConfigError("server.tls_cert_file and server.tls_key_file go together "
                             f"(got {self.tls_cert_file=}, {self.tls_key_file=})")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise SidecarConfigError("server.tls_client_ca_file (mutual TLS) needs "
                             "server.tls_cert_file and server.tls_key_file")
        if isinstance(self.socket_mode, str):
            try:
                self.socket_mode = int(self.socket_mode, 8)
            except ValueError:
                raise SidecarConfigError(f"server.socket_mode={self.socket_mode!r} must be an octal "
                                 "mode such as '0660'") from None
        if (not isinstance(self.socket_mode, int) or isinstance(self.socket_mode, bool)
                or not 0 <= self.socket_mode <= 0o777):
            raise SidecarConfigError(f"server.socket_mode={self.socket_mode!r} must be a mode in "
                             "0..0o777")
        if self.socket_mode & 0o007 and not self.allow_insecure_remote:
            raise SidecarConfigError(f"server.socket_mode={oct(self.socket_mode)} lets every local "
                             "user connect; use 0o660 or stricter (or allow_insecure_remote)")
        if self.event_loop not in EVENT_LOOPS:
            raise SidecarConfigError(f"server.event_loop={self.event_loop!r} must be one of "
                             f"{EVENT_LOOPS}")
        if not 0 < self.submit_yield_ms <= 1000:
            raise SidecarConfigError(f"server.submit_yield_ms={self.submit_yield_ms!r} must be in "
                             "(0, 1000]")
        for name in ("max_message_mb", "max_inflight_rpc_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SidecarConfigError(f"server.{name}={value!r} must be a positive integer")
        if self.engine_death_grace_s < 0:
            raise SidecarConfigError(f"{self.engine_death_grace_s=} must be >= 0")
        self.owner = as_dataclass(OwnerConfig, self.owner, "server.owner")


def _default_warmup_prompts() -> list[str]:
    return ["Hello!", "Reply in one short sentence: my order has not arrived yet."]


@dataclass
class WarmupConfig:
    """Warm-up generations run after the engine loaded and before health says ``SERVING``."""

    enabled: bool = True
    """Run the warm-up at all."""

    prompts: list[str] = field(default_factory=_default_warmup_prompts)
    """Short user messages (each goes through the chat template, like real prompts)."""

    stable_prefixes: list[str] = field(default_factory=list)
    """The stable prompt prefixes real requests will start with (e.g. the pipeline's
    ``template.stable``); each is sent followed by every prompt, to fill the prefix cache."""

    max_tokens: int = 8
    """Output tokens of each warm-up generation."""

    rounds: int = 2
    """Times each prompt is sent (one round after the other)."""

    timeout_s: float = 300.0
    """Longest the warm-up may take; past it, start-up fails."""

    calibrate: bool = True
    """After the warm-up, time one generation alone and ``scheduler.max_in_flight``
    (at most ``calibration_max_batch``) together, to seed the service model (deadline-aware admission is informed from the
    first request)."""

    calibration_tokens: int = 16
    """Output tokens of each calibration generation."""

    calibration_max_batch: int = 64
    """Most generations run together to calibrate (a gateway benchmark's
    ``max_in_flight`` of thousands would otherwise queue them in the engine)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "rounds", "calibration_tokens", "calibration_max_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SidecarConfigError(f"warmup.{name}={value!r} must be a positive integer")
        for name in ("prompts", "stable_prefixes"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise SidecarConfigError(f"warmup.{name} must be a list of strings, got {value!r}")
        if not 0 < self.timeout_s <= 3600:
            raise SidecarConfigError(f"warmup.timeout_s={self.timeout_s!r} must be in (0, 3600]")

    def texts(self) -> list[str]:
        """The prompt texts of one round.

        Example:
            >>> WarmupConfig(prompts=["Hi"], stable_prefixes=["You are helpful."]).texts()
            ['Hi', 'You are helpful.\\nHi']
        """
        prompts = self.prompts or ["Hello!"]
        return [*prompts, *(f"{prefix}\n{p}" for prefix in self.stable_prefixes
                            for p in prompts)]


@dataclass
class SidecarConfig:
    """Everything the ``sts sidecar`` process needs."""

    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    results: ResultChannelConfig = field(default_factory=ResultChannelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    intake: IntakeConfig = field(default_factory=IntakeConfig)

    FREE_FORM: ClassVar[frozenset[str]] = frozenset(
        {"engine.engine_args", "engine.simulated", "results.kafka.producer",
         "intake.consumer"})
    """Mappings that take keys of their own (handed to vLLM, the simulated engine and
    confluent-kafka); every other mapping is a section with fixed keys."""

    @classmethod
    def sections(cls) -> dict[str, type]:
        """Section name -> its dataclass, from the fields above (listed once).

        Example:
            >>> list(SidecarConfig.sections())
            ['server', 'engine', 'scheduler', 'results', 'warmup', 'intake']
        """
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}  # type: ignore[misc]

    def __post_init__(self) -> None:
        if self.intake.topic and not self.intake_bootstrap():
            raise SidecarConfigError("intake.topic needs intake.bootstrap_servers (or "
                                     "results.kafka.bootstrap_servers)")

    def intake_bootstrap(self) -> str | None:
        """The brokers of the Kafka intake: its own, else the result channel's."""
        return self.intake.bootstrap_servers or self.results.kafka.bootstrap()

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "SidecarConfig":
        """Build from a nested mapping (as read from YAML); unknown keys are errors."""
        return cls(**build_sections(cls.sections(), data, what="sidecar config"))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "SidecarConfig":
        """Read a YAML file such as ``conf/sidecar.yaml``.

        Raises:
            ConfigError: one line naming the problem and the file (missing file,
                malformed YAML, unknown section or key, bad value).

        Example:
            >>> SidecarConfig.from_yaml("/no/such/sidecar.yaml")
            Traceback (most recent call last):
            ...
            sidecar.exceptions.ConfigError: config file not found (/no/such/sidecar.yaml)
        """
        try:
            return cls.from_dict(read_yaml(path))
        except (ValueError, TypeError) as e:
            if isinstance(e, ConfigError) and not isinstance(e, SidecarConfigError):
                raise  # already says where (a missing or malformed file)
            raise ConfigError(_with_where(e, str(path))) from None

    def with_overrides(self, overrides: dict[str, Any]) -> "SidecarConfig":
        """Return a copy with dotted keys replaced (``{"server.listen": "...",
        "scheduler.pools.low.max_queued": 100}``); ``None`` values are ignored so
        unset CLI flags keep the file's value. A key of a free-form mapping may hold
        dots itself (``results.kafka.producer.security.protocol``)."""
        data = dataclasses.asdict(self)
        for dotted, value in overrides.items():
            if value is None:
                continue
            *parents, key = _split_key(dotted, self.FREE_FORM)
            node = data
            for part in parents:
                if not isinstance(node, dict) or part not in node:
                    raise SidecarConfigError(f"unknown config key {dotted!r}")
                node = node[part]
            # Free-form mappings (engine_args, simulated, producer) take new keys;
            # sections do not.
            free_form = ".".join(parents) in self.FREE_FORM
            if not parents or not isinstance(node, dict) or (key not in node and not free_form):
                raise SidecarConfigError(f"unknown config key {dotted!r}")
            node[key] = value
        return SidecarConfig.from_dict(data)


def _split_key(dotted: str, free_form: frozenset[str]) -> list[str]:
    """The parts of a dotted config key; the key inside a free-form mapping stays whole.

    Example:
        >>> _split_key("results.kafka.producer.security.protocol", frozenset({"results.kafka.producer"}))
        ['results', 'kafka', 'producer', 'security.protocol']
    """
    for prefix in free_form:
        if dotted.startswith(prefix + ".") and len(dotted) > len(prefix) + 1:
            return [*prefix.split("."), dotted[len(prefix) + 1:]]
    return dotted.split(".")


def _with_where(error: Exception, where: str) -> str:
    """``error`` as one line ending ``(<where>)`` (unless it names a place already)."""
    text = one_line(error)
    return text if text.endswith(")") and where in text else f"{text} ({where})"


def default_cache_dir() -> Path:
    """Where prepared models live: ``$STS_CACHE_DIR`` or ``~/.cache/sts-spark``."""
    return Path(os.environ.get("STS_CACHE_DIR", Path.home() / ".cache" / "sts-spark"))
