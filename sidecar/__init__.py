"""sts-spark sidecar (layer L3): the gRPC gateway in front of vLLM.

Public names, re-exported from their modules: what other packages (the Spark side,
the harness, the benchmarks) may use besides :mod:`sidecar.contract`,
:mod:`sidecar.client` and the generated :mod:`sidecar.pb`.
"""

# From sidecar.admission
from sidecar.admission import Ack, DedupeWindow

# From sidecar.atomic_files
from sidecar.atomic_files import (
    write_atomically,
    write_folder_atomically,
    write_parquet_atomically,
    write_text_atomically,
)

# From sidecar.client
from sidecar.client import SidecarClient, request_to_proto

# From sidecar.config
from sidecar.config import (
    EngineConfig,
    KafkaChannelConfig,
    ResultChannelConfig,
    SchedulerConfig,
    ServerConfig,
    SidecarConfig,
)

# From sidecar.config_files
from sidecar.config_files import as_dataclass, build_sections, read_yaml

# From sidecar.contract
from sidecar.contract import RESULT_SCHEMA

# From sidecar.credentials
from sidecar.credentials import (
    TOKEN_METADATA_KEY,
    ClientSecurity,
    read_pem,
    read_token,
    security_fields,
)

# From sidecar.engines.registry
from sidecar.engines.registry import ENGINE_KINDS

# From sidecar.event_loop
from sidecar.event_loop import EVENT_LOOPS

# From sidecar.exceptions
from sidecar.exceptions import ConfigError, SidecarError, one_line

# From sidecar.lazy_exports
from sidecar.lazy_exports import lazy_exports

# From sidecar.model_prep
from sidecar.model_prep import prepare_default_model

# From sidecar.otel
from sidecar.otel import Tracing, otel_environment, start_tracing, tracing_requested

# From sidecar.percentiles
from sidecar.percentiles import percentile, percentiles

# From sidecar.result_channels.registry
from sidecar.result_channels.registry import RESULT_CHANNEL_KINDS

# From sidecar.shipped
from sidecar.shipped import conf_dir

__all__ = [
    "ENGINE_KINDS",
    "EVENT_LOOPS",
    "RESULT_CHANNEL_KINDS",
    "RESULT_SCHEMA",
    "TOKEN_METADATA_KEY",
    "Ack",
    "ClientSecurity",
    "ConfigError",
    "DedupeWindow",
    "EngineConfig",
    "KafkaChannelConfig",
    "ResultChannelConfig",
    "SchedulerConfig",
    "ServerConfig",
    "SidecarClient",
    "SidecarConfig",
    "SidecarError",
    "Tracing",
    "as_dataclass",
    "build_sections",
    "conf_dir",
    "lazy_exports",
    "one_line",
    "otel_environment",
    "percentile",
    "percentiles",
    "prepare_default_model",
    "read_pem",
    "read_token",
    "read_yaml",
    "request_to_proto",
    "security_fields",
    "start_tracing",
    "tracing_requested",
    "write_atomically",
    "write_folder_atomically",
    "write_parquet_atomically",
    "write_text_atomically",
]
