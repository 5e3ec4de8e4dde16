"""sts-spark sidecar (layer L3): the gRPC gateway in front of vLLM.

Public names, re-exported from their modules.
"""

# From sidecar.config
# From sidecar.client
from sidecar.client import SidecarClient, request_to_proto
from sidecar.config import (
    EngineConfig,
    ResultChannelConfig,
    SchedulerConfig,
    ServerConfig,
    SidecarConfig,
)

# From sidecar.contract
from sidecar.contract import RESULT_SCHEMA

# From sidecar.exceptions
from sidecar.exceptions import ConfigError, SidecarError

# From sidecar.model_prep
from sidecar.model_prep import prepare_default_model

__all__ = [
    "ConfigError",
    "EngineConfig",
    "RESULT_SCHEMA",
    "ResultChannelConfig",
    "SchedulerConfig",
    "ServerConfig",
    "SidecarClient",
    "SidecarConfig",
    "SidecarError",
    "prepare_default_model",
    "request_to_proto",
]
