"""The result channel's columns, in one place for the sidecar and the Spark reader."""

from __future__ import annotations

import pyarrow as pa

#: One row per terminal request (``late`` false), plus, for a request of a
#: ``finish_and_backfill`` pool that was still generating at its deadline, at most
#: one later ``ok`` row with ``late`` true. Timestamps are epoch milliseconds.
RESULT_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("trace_id", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("output_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
        pa.field("enqueue_ts", pa.int64()),
        pa.field("received_ts", pa.int64()),
        pa.field("first_token_ts", pa.int64()),
        pa.field("finish_ts", pa.int64()),
        pa.field("ttft_ms", pa.float64()),
        pa.field("tpot_ms", pa.float64()),
        pa.field("error", pa.string()),
        pa.field("sidecar_id", pa.string()),
        pa.field("model", pa.string()),
        pa.field("priority", pa.string()),
        pa.field("deadline_ts", pa.int64()),
        pa.field("callback_topic", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("fallback_text", pa.string()),
        pa.field("attributes", pa.map_(pa.string(), pa.string())),
        pa.field("submit_ts", pa.int64()),
        pa.field("late", pa.bool_(), nullable=False),
    ]
)
