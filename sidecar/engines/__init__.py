"""Engines the scheduler drives, behind one base class, and the factory that builds one.

``vllm`` is real generation with vLLM's ``AsyncLLM``; ``simulated`` is a timing
model of a continuous-batching GPU engine for load tests (always labelled).
"""

from __future__ import annotations

from sidecar.config import EngineConfig

# From sidecar.engines.base
from sidecar.engines.base import Engine, EngineProgress, EngineRequest, EngineStats

__all__ = ["Engine", "EngineProgress", "EngineRequest", "EngineStats", "build_engine"]


def build_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config.kind`` names (imports vLLM only when needed)."""
    if config.kind == "simulated":
        from sidecar.engines.simulated import (
            SimulatedCluster,
            SimulatedEngine,
            SimulatedEngineConfig,
        )

        sim = SimulatedEngineConfig(**config.simulated)
        cls = SimulatedCluster if sim.replicas > 1 else SimulatedEngine
        return cls(sim, served_model_name=config.served_model_name)
    from sidecar.engines.vllm import VllmEngine

    return VllmEngine(config)
