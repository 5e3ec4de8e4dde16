"""The engine kinds, listed once: the factory (:func:`sidecar.engines.build_engine`),
the config check (``engine.kind``), every ``--engine`` flag and the docs read them.

A leaf module (it imports nothing of the sidecar), so :mod:`sidecar.config` can use it
without importing the engines.
"""

from __future__ import annotations

from typing import Literal, get_args

#: ``vllm``: vLLM's ``AsyncLLM`` in process (real generation); ``simulated``: a timing
#: model of a continuous-batching GPU engine (load tests only, always labelled).
EngineKind = Literal["vllm", "simulated"]

#: The engine kinds, the default first.
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
