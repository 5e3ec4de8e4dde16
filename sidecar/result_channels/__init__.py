"""Result channels behind one base class, and the factory that builds one.

``files`` appends Parquet files to a landing folder (the embedded default); ``kafka``
produces one record per row to a topic per priority (production). The kinds are
registered once, in :data:`sidecar.kinds.RESULT_CHANNELS`; the server builds its channel
through :func:`build_result_channel` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# From sidecar.kinds
from sidecar.kinds import RESULT_CHANNELS

# From sidecar.result_channels.base
from sidecar.result_channels.base import ResultChannel, ResultChannelStats

if TYPE_CHECKING:
    from sidecar.config import ResultChannelConfig

__all__ = ["RESULT_CHANNELS", "ResultChannel", "ResultChannelStats", "build_result_channel"]


def build_result_channel(config: ResultChannelConfig, sidecar_id: str) -> ResultChannel:
    """Build the channel ``config.kind`` names (imports confluent-kafka only for ``kafka``).

    Raises:
        ConfigError: the channel cannot be built as configured (one line), e.g. the
            ``kafka`` channel without confluent-kafka installed.
    """
    return RESULT_CHANNELS.load(config.kind).from_config(config, sidecar_id)
