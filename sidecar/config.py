"""Configuration of the sidecar: one dataclass per concern, loadable from YAML.

Every field has a default and a docstring. Checks run in ``__post_init__`` and
raise :class:`ValueError` naming the field and the offending value.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

EngineKind = Literal["vllm", "simulated"]
ResultChannelKind = Literal["files"]


@dataclass
class EngineConfig:
    """Which engine serves generation and how it is started."""

    kind: EngineKind = "vllm"
    """``vllm`` (vLLM ``AsyncLLM`` in process) or ``simulated`` (timing model, load tests only)."""

    model: str | None = None
    """Path of the model folder. ``None`` means the prepared SmolLM2 (``sts model prepare``)."""

    served_model_name: str | None = None
    """Name requests use in their ``model`` field; defaults to the model folder's name."""

    apply_chat_template: bool = True
    """Wrap each prompt as the user turn of the model's chat template (instruct models)."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.AsyncEngineArgs`` (e.g. ``max_num_seqs``)."""

    simulated: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for :class:`sidecar.simulated_engine.SimulatedEngineConfig`."""

    KINDS: ClassVar[tuple[str, ...]] = ("vllm", "simulated")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"{self.kind=} must be one of {self.KINDS}")


@dataclass
class SchedulerConfig:
    """Admission limits and dispatch into the engine."""

    max_in_flight: int = 8
    """Most requests handed to the engine at once. Keep it near the engine's
    ``max_num_seqs`` so that a ``high`` request never waits behind a full engine batch."""

    max_queued: int = 10_000
    """Most requests waiting in the sidecar (all priorities). Past it requests are shed."""

    max_tokens_cap: int = 2048
    """Largest ``max_tokens`` a request may ask for."""

    max_prompt_tokens: int = 4096
    """Largest prompt, in tokens after the chat template."""

    max_prompt_chars: int = 65_536
    """Largest prompt in characters (checked before tokenizing)."""

    dedupe_window: int = 1_000_000
    """How many recent ``request_id`` values are remembered to drop replays."""

    drain_timeout_s: float = 60.0
    """On SIGTERM, how long in-flight and queued requests may run before they are aborted."""

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_queued", "max_tokens_cap", "max_prompt_tokens",
                     "max_prompt_chars", "dedupe_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"self.{name}={value!r} must be a positive integer")
        if self.drain_timeout_s < 0:
            raise ValueError(f"{self.drain_timeout_s=} must be >= 0")


@dataclass
class ResultChannelConfig:
    """Where terminal results go."""

    kind: ResultChannelKind = "files"
    """``files``: Parquet files appended atomically to ``results_dir``."""

    results_dir: str = "./sts-results"
    """Landing directory read by Spark's file source."""

    flush_interval_s: float = 0.2
    """Pending results are written at least this often (seconds)."""

    max_rows_per_file: int = 10_000
    """A file is written as soon as this many results are pending."""

    def __post_init__(self) -> None:
        if self.kind != "files":
            raise ValueError(f"{self.kind=} must be 'files'")
        if not 0 < self.flush_interval_s <= 0.2:
            raise ValueError(f"{self.flush_interval_s=} must be in (0, 0.2]")
        if self.max_rows_per_file < 1:
            raise ValueError(f"{self.max_rows_per_file=} must be >= 1")


@dataclass
class ServerConfig:
    """The gRPC endpoint."""

    listen: str = "127.0.0.1:50051"
    """``host:port`` (loopback) or ``unix:///path/to.sock``."""

    sidecar_id: str | None = None
    """Identity written into every result; defaults to ``<hostname>-<pid>``."""

    max_message_mb: int = 64
    """Largest gRPC message (a submitted batch), in MiB."""

    shutdown_grace_s: float = 5.0
    """Grace period for open RPCs when the server stops."""

    log_requests: bool = False
    """Log every admitted and finished request (debugging)."""


@dataclass
class SidecarConfig:
    """Everything the ``sts sidecar`` process needs."""

    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    results: ResultChannelConfig = field(default_factory=ResultChannelConfig)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "SidecarConfig":
        """Build from a nested mapping (as read from YAML); unknown keys are errors."""
        return cls(**build_sections(_SECTION_TYPES, data, what="sidecar config"))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "SidecarConfig":
        """Read a YAML file such as ``conf/sidecar.yaml``."""
        return cls.from_dict(read_yaml(path))

    def with_overrides(self, overrides: dict[str, Any]) -> "SidecarConfig":
        """Return a copy with dotted keys replaced (``{"server.listen": "..."}``);
        ``None`` values are ignored so unset CLI flags keep the file's value."""
        data = dataclasses.asdict(self)
        for dotted, value in overrides.items():
            if value is None:
                continue
            section, _, key = dotted.partition(".")
            if section not in data or key not in data[section]:
                raise ValueError(f"unknown config key {dotted!r}")
            data[section][key] = value
        return SidecarConfig.from_dict(data)


_SECTION_TYPES: dict[str, type] = {
    "server": ServerConfig,
    "engine": EngineConfig,
    "scheduler": SchedulerConfig,
    "results": ResultChannelConfig,
}


def build_sections(sections: dict[str, type], data: dict[str, Any] | None, *, what: str,
                   error: type[Exception] = ValueError) -> dict[str, Any]:
    """Instantiate one dataclass per section from a nested mapping.

    Unknown sections and unknown keys raise ``error`` naming them; missing
    sections get their defaults. Shared by the sidecar and pipeline configs.
    """
    data = dict(data or {})
    if unknown := set(data) - set(sections):
        raise error(f"unknown {what} sections: {sorted(unknown)}")
    built = {}
    for name, section_cls in sections.items():
        values = data.get(name) or {}
        names = {f.name for f in dataclasses.fields(section_cls)}
        if extra := set(values) - names:
            raise error(f"unknown keys in {what} section {name!r}: {sorted(extra)}")
        built[name] = section_cls(**values)
    return built


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Load one YAML document."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def default_cache_dir() -> Path:
    """Where prepared models live: ``$STS_CACHE_DIR`` or ``~/.cache/sts-spark``."""
    return Path(os.environ.get("STS_CACHE_DIR", Path.home() / ".cache" / "sts-spark"))
