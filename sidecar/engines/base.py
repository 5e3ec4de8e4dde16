"""The engine interface the scheduler drives.

Implementations live beside this module: :mod:`sidecar.engines.vllm` (real
generation with vLLM's ``AsyncLLM``) and :mod:`sidecar.engines.simulated` (a
timing model of a continuous-batching GPU engine, for load tests).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.contract import FinishReason

if TYPE_CHECKING:
    from sidecar.config import EngineConfig


@dataclass(slots=True)
class EngineRequest:
    """What the engine needs to generate one answer (treat it as immutable; not
    ``frozen``, which makes building one per request slower)."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    priority: int
    """vLLM polarity: lower value is scheduled first."""


@dataclass(slots=True)
class EngineProgress:
    """Cumulative state of one generation, yielded as tokens arrive (treat it as
    immutable; not ``frozen``, which makes building one per token slower)."""

    text: str
    """All text generated so far."""

    output_tokens: int
    cached_tokens: int
    finished: bool
    finish_reason: FinishReason | None = None
    """``STOP`` or ``LENGTH`` once finished."""


@dataclass
class EngineStats:
    """Live engine figures (``None`` where the engine does not know)."""

    kv_cache_usage: float | None = None
    """Share of the KV cache in use, 0..1."""
    running: int | None = None
    waiting: int | None = None
    prefix_cache_queries: int | None = None
    """Prompt tokens looked up in the prefix cache since start."""
    prefix_cache_hits: int | None = None
    """Of those, tokens found in the cache."""


class Engine(abc.ABC):
    """A continuous-batching generator the scheduler hands requests to."""

    #: Its name in :data:`sidecar.kinds.ENGINES`; written into stats so outputs are labelled.
    kind: str = ""

    @classmethod
    def from_config(cls, config: "EngineConfig") -> "Engine":
        """The engine ``config`` (the ``engine`` section) describes; what
        :func:`sidecar.engines.build_engine` calls on the registered class."""
        return cls(config)  # type: ignore[call-arg]

    #: Independent batches the engine decodes (one per GPU). The scheduler's batch-size
    #: lever (``preemption.shrink_batch``) needs 1: it cannot shrink one GPU's batch of many.
    batches: int = 1

    @property
    @abc.abstractmethod
    def model_name(self) -> str:
        """Name requests may use in their ``model`` field."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; return when the engine can take requests."""

    @abc.abstractmethod
    def encode_prompt(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt as it will be fed to the model (chat template applied)."""

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineProgress]:
        """Generate; the last item has ``finished=True``. Cancelling the consumer
        aborts the request in the engine."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release the engine. Idempotent."""

    def failure(self) -> str | None:
        """Why the engine can no longer serve, or ``None`` while it is healthy.

        Cheap: the scheduler asks before each batch it admits and from a watchdog.
        Once it returns a reason the sidecar turns ``NOT_SERVING`` and exits.
        """
        return None

    def stats(self) -> EngineStats:
        return EngineStats()
