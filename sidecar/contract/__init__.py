"""The contract between the sidecar and its readers (the Spark side, benchmarks, tools).

This is the only part of the ``sidecar`` package, besides :mod:`sidecar.client` and
the generated wire code in :mod:`sidecar.pb`, that other packages import: the
result schema, the result file names, the wire enums, the clock, atomic
landing-folder writes, the config-file loader, client credentials and tracing.
"""

# From sidecar.contract.clock
from sidecar.contract.clock import now_ms

# From sidecar.contract.config_files
from sidecar.contract.config_files import as_dataclass, build_sections, read_yaml

# From sidecar.contract.credentials
from sidecar.contract.credentials import (
    TOKEN_METADATA_KEY,
    ClientSecurity,
    read_pem,
    read_token,
    security_fields,
)

# From sidecar.contract.files
from sidecar.contract.files import (
    write_atomically,
    write_parquet_atomically,
    write_text_atomically,
)

# From sidecar.contract.shipped
from sidecar.contract.shipped import conf_dir

# From sidecar.contract.percentiles
from sidecar.contract.percentiles import percentile, percentiles

# From sidecar.contract.result_files
from sidecar.contract.result_files import (
    ResultFileKey,
    parse_result_file_name,
    result_file_name,
)

# From sidecar.contract.schema
from sidecar.contract.schema import RESULT_SCHEMA

# From sidecar.contract.tracing
from sidecar.contract.tracing import (
    TRACEPARENT,
    Tracing,
    event_span_id,
    event_traceparent,
    format_traceparent,
    otel_environment,
    parse_traceparent,
    start_tracing,
    traceparent_sampled,
    tracing_requested,
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
    "RESULT_SCHEMA",
    "STATUSES",
    "TOKEN_METADATA_KEY",
    "TRACEPARENT",
    "Tracing",
    "ClientSecurity",
    "FinishReason",
    "Priority",
    "RefusalReason",
    "ResultFileKey",
    "Status",
    "as_dataclass",
    "attributes_problem",
    "build_sections",
    "conf_dir",
    "event_span_id",
    "event_traceparent",
    "format_traceparent",
    "now_ms",
    "otel_environment",
    "parse_traceparent",
    "percentile",
    "percentiles",
    "parse_result_file_name",
    "read_pem",
    "read_token",
    "read_yaml",
    "result_file_name",
    "security_fields",
    "start_tracing",
    "traceparent_sampled",
    "tracing_requested",
    "w3c_trace_id",
    "write_atomically",
    "write_parquet_atomically",
    "write_text_atomically",
]
