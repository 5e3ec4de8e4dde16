"""One way to register a kind of plug-in, and the sidecar's kinds: engines and result
channels.

A kind is a name mapped to a lazily imported class (or factory), the way vLLM
registers its KV connectors (``KVConnectorFactory.register_connector(name, module,
class)``): the config checks, the ``--engine`` flags, the factories and the docs all
read the registry, so each name is spelled once, here, and adding one is one module
plus one :meth:`KindRegistry.register` line. The Spark side registers its kinds (event
sources, result readers, table writers) the same way in :mod:`spark_ext.kinds`.

A leaf module: it imports nothing of the sidecar but its exceptions, so :mod:`sidecar.config` checks names
without importing the engines or channels (vLLM, confluent-kafka).

Example:
    >>> ENGINES.names
    ('vllm', 'simulated')
    >>> ENGINES.load("simulated").__name__
    'SimulatedEngine'
"""

from __future__ import annotations

import importlib
from typing import Any, Generic, TypeVar

from sidecar.exceptions import SidecarConfigError

T = TypeVar("T")


class KindRegistry(Generic[T]):
    """Names of one kind mapped to ``(module, attribute)``, imported on first use.

    Args:
        kind: What the names name, for messages (``"engine"``).
        field: The config key that holds one (``"engine.kind"``), for messages.
        error: The exception a bad name raises (the config's own error type).
    """

    def __init__(self, kind: str, field: str, error: type[Exception] = ValueError) -> None:
        self.kind = kind
        self.field = field
        self.error = error
        self._entries: dict[str, tuple[str, str]] = {}

    def register(self, name: str, module: str, attribute: str) -> None:
        """Make ``name`` the class (or factory) ``module.attribute``; the first one
        registered is the default. A name registered twice is a programming error."""
        if name in self._entries and self._entries[name] != (module, attribute):
            raise ValueError(f"{self.kind} {name!r} is registered already "
                             f"({'.'.join(self._entries[name])})")
        self._entries[name] = (module, attribute)

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they were registered (the default first)."""
        return tuple(self._entries)

    @property
    def default(self) -> str:
        """The first name registered."""
        return self.names[0]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def check(self, name: object) -> None:
        """Raise :attr:`error` naming :attr:`field` when ``name`` is not registered."""
        if name not in self._entries:
            raise self.error(f"{self.field}: {name!r} is not one of {', '.join(self.names)}")

    def load(self, name: str) -> T:
        """The class (or factory) registered as ``name``, imported now."""
        self.check(name)
        module, attribute = self._entries[name]
        return getattr(importlib.import_module(module), attribute)

    def entry(self, name: str) -> tuple[str, str]:
        """``(module, attribute)`` of ``name`` (nothing imported)."""
        self.check(name)
        return self._entries[name]


#: Engines (``engine.kind``): each class has ``from_config(EngineConfig) -> Engine``.
ENGINES: KindRegistry[Any] = KindRegistry("engine", "engine.kind", SidecarConfigError)
ENGINES.register("vllm", "sidecar.engines.vllm", "VllmEngine")
ENGINES.register("simulated", "sidecar.engines.simulated", "SimulatedEngine")

#: Result channels (``results.kind``): each class has
#: ``from_config(ResultChannelConfig, sidecar_id) -> ResultChannel``.
RESULT_CHANNELS: KindRegistry[Any] = KindRegistry("result channel", "results.kind",
                                                  SidecarConfigError)
RESULT_CHANNELS.register("files", "sidecar.result_channels.files", "FilesResultChannel")
RESULT_CHANNELS.register("kafka", "sidecar.result_channels.kafka", "KafkaResultChannel")
