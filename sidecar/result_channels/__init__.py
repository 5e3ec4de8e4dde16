"""Result channels behind one base class, and the factory that builds one.

``files`` appends Parquet files to a landing folder (the embedded default); ``kafka``
produces one record per row to a topic per priority (production). The kinds are
listed once, in :mod:`sidecar.result_channels.registry`; the server builds its channel
through :func:`build_result_channel` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

# From sidecar.result_channels.base
from sidecar.result_channels.base import ResultChannel, ResultChannelStats

# From sidecar.result_channels.registry
from sidecar.result_channels.registry import RESULT_CHANNEL_KINDS, ResultChannelKind

if TYPE_CHECKING:
    from sidecar.config import ResultChannelConfig

__all__ = ["RESULT_CHANNEL_KINDS", "ResultChannel", "ResultChannelKind", "ResultChannelStats",
           "build_result_channel"]


def _files(config: ResultChannelConfig, sidecar_id: str) -> ResultChannel:
    from sidecar.result_channels.files import FilesResultChannel

    return FilesResultChannel(config, sidecar_id)


def _kafka(config: ResultChannelConfig, sidecar_id: str) -> ResultChannel:
    from sidecar.result_channels.kafka import KafkaResultChannel  # confluent-kafka on use

    return KafkaResultChannel(config.kafka, sidecar_id, flush_interval_s=config.flush_interval_s)


#: How each kind of :data:`RESULT_CHANNEL_KINDS` is built.
_BUILDERS: dict[str, Callable[[ResultChannelConfig, str], ResultChannel]] = {
    "files": _files, "kafka": _kafka}
assert set(_BUILDERS) == set(RESULT_CHANNEL_KINDS), "every result channel kind needs a builder"


def build_result_channel(config: ResultChannelConfig, sidecar_id: str) -> ResultChannel:
    """Build the channel ``config.kind`` names (imports confluent-kafka only for ``kafka``).

    Raises:
        ConfigError: the channel cannot be built as configured (one line), e.g. the
            ``kafka`` channel without confluent-kafka installed.
    """
    return _BUILDERS[config.kind](config, sidecar_id)
