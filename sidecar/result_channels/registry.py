"""The result channel kinds, listed once: the factory
(:func:`sidecar.result_channels.build_result_channel`), the config check
(``results.kind``) and the docs read them.

A leaf module (it imports nothing of the sidecar), so :mod:`sidecar.config` can use it
without importing the channels.
"""

from __future__ import annotations

from typing import Literal, get_args

#: ``files``: Parquet files appended atomically to a landing folder (embedded default);
#: ``kafka``: one record per result on a topic per priority (production).
ResultChannelKind = Literal["files", "kafka"]

#: The result channel kinds, the default first.
RESULT_CHANNEL_KINDS: tuple[str, ...] = get_args(ResultChannelKind)
