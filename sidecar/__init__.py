"""sts-spark sidecar (layer L3): the gRPC gateway in front of vLLM.

Public names, re-exported from their modules: what other packages (the Spark side,
the harness, the benchmarks) may use besides :mod:`sidecar.contract`,
:mod:`sidecar.client` and the generated :mod:`sidecar.pb`. They are loaded on first
use (:func:`lazy_exports`), so a Spark Python worker that needs one helper (say
:func:`percentiles`) does not load the gateway's admission, config and engines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.lazy_exports import lazy_exports

#: Public name -> the module it comes from.
_EXPORTS = {
    # From sidecar.acks
    "Ack": "sidecar.acks",
    # From sidecar.admission
    "DedupeWindow": "sidecar.admission",
    # From sidecar.atomic_files
    "write_atomically": "sidecar.atomic_files",
    "write_folder_atomically": "sidecar.atomic_files",
    "write_parquet_atomically": "sidecar.atomic_files",
    "write_text_atomically": "sidecar.atomic_files",
    # From sidecar.client
    "SidecarClient": "sidecar.client",
    "request_to_proto": "sidecar.client",
    # From sidecar.config
    "EngineConfig": "sidecar.config",
    "KafkaChannelConfig": "sidecar.config",
    "ResultChannelConfig": "sidecar.config",
    "SchedulerConfig": "sidecar.config",
    "ServerConfig": "sidecar.config",
    "SidecarConfig": "sidecar.config",
    # From sidecar.config_files
    "as_dataclass": "sidecar.config_files",
    "build_sections": "sidecar.config_files",
    "read_yaml": "sidecar.config_files",
    # From sidecar.contract
    "RESULT_SCHEMA": "sidecar.contract",
    # From sidecar.credentials
    "TOKEN_METADATA_KEY": "sidecar.credentials",
    "ClientSecurity": "sidecar.credentials",
    "read_pem": "sidecar.credentials",
    "read_token": "sidecar.credentials",
    "security_fields": "sidecar.credentials",
    # From sidecar.kinds
    "ENGINES": "sidecar.kinds",
    "KindRegistry": "sidecar.kinds",
    "RESULT_CHANNELS": "sidecar.kinds",
    # From sidecar.event_loop
    "EVENT_LOOPS": "sidecar.event_loop",
    # From sidecar.engines.simulated
    "SLOW_CPU": "sidecar.engines.simulated",
    "SimulatedEngineConfig": "sidecar.engines.simulated",
    "simulated_set_args": "sidecar.engines.simulated",
    # From sidecar.exceptions
    "ConfigError": "sidecar.exceptions",
    "SidecarConfigError": "sidecar.exceptions",
    "SidecarError": "sidecar.exceptions",
    "one_line": "sidecar.exceptions",
    # From sidecar.model_prep
    "prepare_default_model": "sidecar.model_prep",
    # From sidecar.owner_watch
    "claim_owner": "sidecar.owner_watch",
    "pid_running": "sidecar.owner_watch",
    # From sidecar.otel
    "Tracing": "sidecar.otel",
    "otel_environment": "sidecar.otel",
    "start_tracing": "sidecar.otel",
    "tracing_requested": "sidecar.otel",
    # From sidecar.quantiles
    "percentile": "sidecar.quantiles",
    "percentiles": "sidecar.quantiles",
    # From sidecar.scale_signal
    "DemandMeter": "sidecar.scale_signal",
    "desired_gpus": "sidecar.scale_signal",
    "compute_scale_signal": "sidecar.scale_signal",
    # From sidecar.shipped
    "conf_dir": "sidecar.shipped",
}

__all__ = [
    "Ack",
    "ClientSecurity",
    "ConfigError",
    "DedupeWindow",
    "DemandMeter",
    "ENGINES",
    "EVENT_LOOPS",
    "EngineConfig",
    "KindRegistry",
    "KafkaChannelConfig",
    "RESULT_CHANNELS",
    "RESULT_SCHEMA",
    "SLOW_CPU",
    "ResultChannelConfig",
    "SchedulerConfig",
    "ServerConfig",
    "SidecarClient",
    "SidecarConfig",
    "SidecarConfigError",
    "SidecarError",
    "SimulatedEngineConfig",
    "TOKEN_METADATA_KEY",
    "Tracing",
    "as_dataclass",
    "build_sections",
    "claim_owner",
    "compute_scale_signal",
    "conf_dir",
    "desired_gpus",
    "lazy_exports",
    "one_line",
    "otel_environment",
    "percentile",
    "percentiles",
    "pid_running",
    "prepare_default_model",
    "read_pem",
    "read_token",
    "read_yaml",
    "request_to_proto",
    "security_fields",
    "simulated_set_args",
    "start_tracing",
    "tracing_requested",
    "write_atomically",
    "write_folder_atomically",
    "write_parquet_atomically",
    "write_text_atomically",
]

#: Public names that differ from their name in the module (``scale_signal`` is also the module's name).
_RENAMED = {"compute_scale_signal": "scale_signal"}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _RENAMED)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from sidecar.acks import Ack
    from sidecar.admission import DedupeWindow
    from sidecar.atomic_files import write_atomically, write_folder_atomically, write_parquet_atomically, write_text_atomically
    from sidecar.client import SidecarClient, request_to_proto
    from sidecar.config import EngineConfig, KafkaChannelConfig, ResultChannelConfig, SchedulerConfig, ServerConfig, SidecarConfig
    from sidecar.config_files import as_dataclass, build_sections, read_yaml
    from sidecar.contract import RESULT_SCHEMA
    from sidecar.credentials import TOKEN_METADATA_KEY, ClientSecurity, read_pem, read_token, security_fields
    from sidecar.kinds import ENGINES, RESULT_CHANNELS, KindRegistry
    from sidecar.event_loop import EVENT_LOOPS
    from sidecar.engines.simulated import SLOW_CPU, SimulatedEngineConfig, simulated_set_args
    from sidecar.exceptions import ConfigError, SidecarConfigError, SidecarError, one_line
    from sidecar.model_prep import prepare_default_model
    from sidecar.owner_watch import claim_owner, pid_running
    from sidecar.otel import Tracing, otel_environment, start_tracing, tracing_requested
    from sidecar.quantiles import percentile, percentiles
    from sidecar.scale_signal import DemandMeter, desired_gpus
    from sidecar.scale_signal import scale_signal as compute_scale_signal
    from sidecar.shipped import conf_dir
