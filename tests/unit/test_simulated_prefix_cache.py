"""The simulated engine's prefix cache: whole leading blocks of a prompt seen before are
not prefilled again, are reported as cached tokens, and feed the hit rate."""

from __future__ import annotations

import asyncio

from sidecar.config import SchedulerConfig
from sidecar.engines.base import EngineRequest
from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from tests.utils import make_sidecar_request, until, with_scheduler

STABLE = "You are the support desk of a parcel company. Answer in one short sentence. " * 3
"""228 characters = 57 stand-in tokens = 3 whole blocks of 16."""
EXACT = "".join(f"{i:04d}" for i in range(64))
"""256 characters = 64 stand-in tokens = 4 whole blocks."""


def _engine(**kw) -> SimulatedEngine:
    return SimulatedEngine(SimulatedEngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0, **kw))


async def _cached(engine: SimulatedEngine, prompt: str) -> int:
    [ids] = engine.encode_prompt([prompt])
    last = None
    async for last in engine.generate(EngineRequest(f"r{id(prompt)}-{len(prompt)}", ids, 2,
                                                    0.0, None, 0)):
        pass
    assert last is not None and last.finished
    return last.cached_tokens


def test_repeated_and_shared_prefixes_hit_whole_blocks_only() -> None:
    async def run() -> None:
        engine = _engine()
        await engine.start()
        try:
            assert await _cached(engine, STABLE + "Ticket: where is parcel 1?") == 0
            # Same stable prefix, another ticket: the 3 whole blocks of the prefix hit.
            assert await _cached(engine, STABLE + "Ticket: my parcel 22 is late!") == 48
            # Dynamic text first (pitfall 3): nothing is found.
            assert await _cached(engine, "Ticket: parcel 3. " + STABLE) == 0
            # The same prompt of exactly 4 blocks again: all but the block holding the
            # last token (it is always computed).
            assert await _cached(engine, EXACT) == 0
            assert await _cached(engine, EXACT) == 48
            stats = engine.stats()
            assert stats.prefix_cache_hits == 48 + 48
            assert stats.prefix_cache_queries == sum(
                len(engine.encode_prompt([p])[0]) for p in (
                    STABLE + "Ticket: where is parcel 1?", STABLE + "Ticket: my parcel 22 is late!",
                    "Ticket: parcel 3. " + STABLE, EXACT, EXACT))
        finally:
            await engine.shutdown()

    asyncio.run(run())


def test_the_cache_keeps_its_most_recent_blocks_and_can_be_off() -> None:
    async def run() -> None:
        small, off = _engine(prefix_cache_blocks=2), _engine(prefix_cache_blocks=0)
        for engine in (small, off):
            await engine.start()
        try:
            assert await _cached(small, STABLE + "a") == 0
            # Only the last 2 of the 3 prefix blocks are kept: the chain breaks at once.
            assert await _cached(small, STABLE + "b") == 0
            assert await _cached(off, STABLE + "a") == 0
            assert await _cached(off, STABLE + "b") == 0
            assert off.stats().prefix_cache_queries is None
        finally:
            for engine in (small, off):
                await engine.shutdown()

    asyncio.run(run())


def test_the_sidecar_reports_cached_tokens_and_the_hit_rate() -> None:
    async def body(scheduler, results) -> None:
        for i in range(4):
            scheduler.submit_batch([make_sidecar_request(f"p{i}", prompt=STABLE + f"ticket {i}",
                                                         max_tokens=2)])
            await until(lambda: len(results) == i + 1, 10)
        stats = scheduler.stats()
        assert 0.5 < stats.prefix_cache_hit_rate < 1.0

    results = asyncio.run(with_scheduler(_engine(), SchedulerConfig(), body))
    assert [r.cached_tokens for r in results] == [0, 48, 48, 48]
    assert all(r.status == "ok" for r in results)
