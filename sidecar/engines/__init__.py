"""Engines the scheduler drives, behind one base class, and the factory that builds one.

``vllm`` is real generation with vLLM's ``AsyncLLM``; ``simulated`` is a timing
model of a continuous-batching GPU engine for load tests (always labelled). The kinds
are listed once, in :mod:`sidecar.engines.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

# From sidecar.engines.base
from sidecar.engines.base import Engine, EngineProgress, EngineRequest, EngineStats

# From sidecar.engines.registry
from sidecar.engines.registry import ENGINE_KINDS, EngineKind

if TYPE_CHECKING:
    from sidecar.config import EngineConfig

__all__ = ["ENGINE_KINDS", "Engine", "EngineKind", "EngineProgress", "EngineRequest",
           "EngineStats", "build_engine"]


def _simulated(config: EngineConfig) -> Engine:
    from sidecar.engines.simulated import (
        SimulatedCluster,
        SimulatedEngine,
        SimulatedEngineConfig,
    )

    sim = SimulatedEngineConfig(**config.simulated)
    cls = SimulatedCluster if sim.replicas > 1 else SimulatedEngine
    return cls(sim, served_model_name=config.served_model_name)


def _vllm(config: EngineConfig) -> Engine:
    from sidecar.engines.vllm import VllmEngine  # imports vLLM only when built

    return VllmEngine(config)


#: How each kind of :data:`ENGINE_KINDS` is built.
_BUILDERS: dict[str, Callable[[EngineConfig], Engine]] = {"vllm": _vllm,
                                                          "simulated": _simulated}
assert set(_BUILDERS) == set(ENGINE_KINDS), "every engine kind needs a builder"


def build_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config.kind`` names (imports vLLM only when needed)."""
    return _BUILDERS[config.kind](config)
