"""The Spark side of a result channel: one class per channel the sidecar writes
(``sidecar.result_channel``, the sidecar's ``results.kind``).

A :class:`ChannelSide` is everything the pipeline does with its channel: the folders or
topics it needs at start, the sidecars' result rows as a stream, the answers query's
two inputs from it (this pipeline's results, each with its row as JSON, and the submit
tasks' acks) and the writer the submit tasks leave their acks with
(:class:`~spark_ext.submit.ack_channel.AckChannel`: the acks travel on the result
channel's twin, so the submit query writes no table). The pipeline asks its channel and
never its name; a channel is one module and one line in :data:`spark_ext.kinds.CHANNEL_SIDES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_ext.config import PipelineConfig
    from spark_ext.submit.ack_channel import AckChannel


@dataclass
class ChannelStreams:
    """What the answers query reads from its channel."""

    results: DataFrame
    """Result rows (the result columns, plus the :attr:`exclude` ones)."""
    payload: Column
    """Each result row as JSON (what the ``results`` table keeps)."""
    acks: DataFrame
    """The submit tasks' ack rows of this pipeline."""
    exclude: tuple[str, ...] = ()
    """Columns of :attr:`results` that are not result columns (dropped after the payload)."""


class ChannelSide(ABC):
    """The pipeline's side of one result channel.

    Args:
        config: The pipeline's config.
        pipeline_id: The pipeline reading the channel (acks are kept per pipeline).
    """

    name: ClassVar[str]
    """The channel's name (``sidecar.result_channel``)."""
    needs_kafka: ClassVar[bool] = False
    """Whether the pipeline's ``kafka`` section must name brokers for it."""

    def __init__(self, config: PipelineConfig, pipeline_id: str = "") -> None:
        self.config = config
        self.pipeline_id = pipeline_id

    def folders(self) -> list[str]:
        """Local folders that must exist before the queries are built."""
        return []

    def prepare(self) -> None:
        """Make what the channel needs when the pipeline starts (topics, ...)."""

    @abstractmethod
    def source(self) -> str:
        """Where the results come from, for the job's start-up line."""

    @abstractmethod
    def results(self, spark: SparkSession) -> DataFrame:
        """The sidecars' result rows as a stream (``sidecar.contract.RESULT_SCHEMA``)."""

    @abstractmethod
    def streams(self, spark: SparkSession, ack_schema: StructType) -> ChannelStreams:
        """The answers query's results and acks (acks of ``ack_schema``)."""

    @abstractmethod
    def ack_channel(self, run_id: str, run_started_ms: int) -> AckChannel:
        """Where the submit query's run ``run_id`` leaves its tasks' acks."""
