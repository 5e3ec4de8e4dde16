"""The Spark side of the result channels (:mod:`spark_ext.l4.channels.base`): ``files``
(:mod:`~spark_ext.l4.channels.files`) and ``kafka`` (:mod:`~spark_ext.l4.channels.kafka`),
registered in :data:`spark_ext.kinds.CHANNEL_SIDES`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ext.kinds import CHANNEL_SIDES
from spark_ext.l4.channels.base import ChannelSide, ChannelStreams

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_ext.config import PipelineConfig


def channel_side(config: PipelineConfig, pipeline_id: str = "") -> ChannelSide:
    """The Spark side of ``config.sidecar.result_channel``."""
    return CHANNEL_SIDES.load(config.sidecar.result_channel)(config, pipeline_id)


def read_results(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The sidecars' result rows as a stream, from the channel of
    ``config.sidecar.result_channel`` (the result columns of
    ``sidecar.contract.RESULT_SCHEMA``)."""
    return channel_side(config).results(spark)


__all__ = ["ChannelSide", "ChannelStreams", "channel_side", "read_results"]
