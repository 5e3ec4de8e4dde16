"""The wire and file contract between the sidecar and its readers (the Spark side,
benchmarks, tools).

Only what both sides must agree on: the ``sts.v1`` enums as Python enums, the result
schema, the names of result files, the result-on-Kafka JSON format, the trace context
a request carries, and the clock of every ``*_ts`` field. Helpers the other packages
share with the sidecar (YAML sections, credentials, tracing set-up, percentiles,
atomic writes) are exported by :mod:`sidecar` itself.
"""

# From sidecar.contract.clock
from sidecar.contract.clock import now_ms

# From sidecar.contract.result_files
from sidecar.contract.result_files import (
    ResultFileKey,
    parse_result_file_name,
    result_file_name,
)

# From sidecar.contract.result_json
from sidecar.contract.result_json import (
    RESULT_COLUMNS,
    decode_result,
    encode_result,
    result_topic,
)

# From sidecar.contract.schema
from sidecar.contract.schema import RESULT_SCHEMA

# From sidecar.contract.trace_context
from sidecar.contract.trace_context import (
    TRACEPARENT,
    event_span_id,
    event_traceparent,
    format_traceparent,
    parse_traceparent,
    traceparent_sampled,
    w3c_trace_id,
)

# From sidecar.contract.wire
from sidecar.contract.wire import (
    MAX_ATTRIBUTE_BYTES,
    MAX_ATTRIBUTE_KEYS,
    PRIORITY_NAMES,
    STATUSES,
    FinishReason,
    Priority,
    RefusalReason,
    Status,
    attributes_problem,
)

__all__ = [
    "MAX_ATTRIBUTE_BYTES",
    "MAX_ATTRIBUTE_KEYS",
    "PRIORITY_NAMES",
    "RESULT_COLUMNS",
    "RESULT_SCHEMA",
    "STATUSES",
    "TRACEPARENT",
    "FinishReason",
    "Priority",
    "RefusalReason",
    "ResultFileKey",
    "Status",
    "attributes_problem",
    "decode_result",
    "encode_result",
    "event_span_id",
    "event_traceparent",
    "format_traceparent",
    "now_ms",
    "parse_result_file_name",
    "parse_traceparent",
    "result_file_name",
    "result_topic",
    "traceparent_sampled",
    "w3c_trace_id",
]
