"""The simulated engine's chunked prefill (``max_num_batched_tokens``, vLLM V1's): a long
prompt is prefilled over several steps, and the decode steps of the sequences beside it
stay short; without it, one step carries the whole prompt. In virtual time."""

from __future__ import annotations

import asyncio
import time

from sidecar.engines.base import EngineRequest
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from tests.unit.virtual_time import run_in_virtual_time


def _gaps_and_ttft(budget: int) -> tuple[float, float]:
    """A sequence decoding 100 tokens (progress every token) while a 5,000-token prompt
    arrives beside it, on an engine of 10 ms steps that prefills 10,000 tokens/s: the
    longest gap between the first sequence's tokens and the long prompt's first token
    time, seconds."""
    async def run() -> tuple[float, float]:
        engine = SimulatedEngine(SimulatedEngineConfig(
            step_base_ms=10.0, step_per_seq_ms=0.0, prefill_tokens_per_s=10_000.0,
            max_num_batched_tokens=budget, progress_every=1, prefix_cache_blocks=0))
        await engine.start()
        times: list[float] = []

        async def decode() -> None:
            [ids] = engine.encode_prompt(["short prompt"])
            async for _ in engine.generate(EngineRequest("a", ids, 100, 0.0, None, 0)):
                times.append(time.monotonic())

        async def long_prompt() -> float:
            await asyncio.sleep(0.2)
            [ids] = engine.encode_prompt(["x" * 20_000])  # 5,000 stand-in tokens
            started = time.monotonic()
            async for _ in engine.generate(EngineRequest("b", ids, 2, 0.0, None, 0)):
                return time.monotonic() - started
            raise AssertionError("no token")

        try:
            _, ttft = await asyncio.gather(decode(), long_prompt())
        finally:
            await engine.shutdown()
        return max(b - a for a, b in zip(times, times[1:])), ttft

    return run_in_virtual_time(run())


def test_a_long_prompt_is_prefilled_in_chunks_beside_a_decoding_sequence() -> None:
    whole_gap, whole_ttft = _gaps_and_ttft(0)
    assert whole_gap >= 0.5  # one step of 10 ms + 5,000 tokens at 10,000/s
    chunked_gap, chunked_ttft = _gaps_and_ttft(1000)
    assert chunked_gap <= 0.011 + 999 / 10_000  # a step's decode + at most 999 prompt tokens
    assert 0.5 <= chunked_ttft <= 0.7, chunked_ttft  # 6 steps of at most 999 tokens
    assert chunked_ttft >= whole_ttft
