"""``engine.ignore_eos`` (a trace replay's forced output lengths) reaches vLLM's
sampling parameters; it loads from YAML and ``--set`` and refuses a non-boolean."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sidecar.config import EngineConfig, SidecarConfig
from sidecar.engines.base import EngineRequest
from sidecar.engines.vllm import VllmEngine
from sidecar.exceptions import SidecarConfigError


class _RecordingLLM:
    """Stands in for ``AsyncLLM``: the test is about what the engine asks of vLLM."""

    def __init__(self) -> None:
        self.params: list[object] = []

    async def generate(self, prompt, params, request_id, priority=0) -> AsyncIterator[object]:
        self.params.append(params)
        return
        yield  # an async generator that yields nothing


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_ignore_eos_reaches_vllm_sampling_params(ignore_eos: bool) -> None:
    engine = VllmEngine(EngineConfig(model="unused-model-dir", ignore_eos=ignore_eos))
    engine._llm = llm = _RecordingLLM()

    async def drain() -> None:
        async for _ in engine.generate(EngineRequest("r", [1, 2, 3], 5, 0.0, None, 0)):
            pass

    asyncio.run(drain())
    [params] = llm.params
    assert params.ignore_eos is ignore_eos and params.max_tokens == 5  # type: ignore[attr-defined]


def test_ignore_eos_is_a_boolean_option() -> None:
    assert SidecarConfig.from_dict({"engine": {"ignore_eos": True}}).engine.ignore_eos is True
    with pytest.raises(SidecarConfigError, match="engine.ignore_eos='yes'"):
        EngineConfig(ignore_eos="yes")  # type: ignore[arg-type]
