"""Engines the scheduler drives, behind one base class, and the factory that builds one.

``vllm`` is real generation with vLLM's ``AsyncLLM``; ``simulated`` is a timing
model of a continuous-batching GPU engine for load tests (always labelled). The kinds
are registered once, in :data:`sidecar.kinds.ENGINES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# From sidecar.engines.base
from sidecar.engines.base import Engine, EngineProgress, EngineRequest, EngineStats

# From sidecar.kinds
from sidecar.kinds import ENGINES

if TYPE_CHECKING:
    from sidecar.config import EngineConfig

__all__ = ["ENGINES", "Engine", "EngineProgress", "EngineRequest", "EngineStats",
           "build_engine"]


def build_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config.kind`` names (imports vLLM only when needed)."""
    return ENGINES.load(config.kind).from_config(config)
