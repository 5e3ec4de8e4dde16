"""Warm-up before ``SERVING``: a few short generations so the first real requests do not
pay the cold start (first kernels and allocations, the tokenizer, the chat template,
and the prefix cache for the configured stable prefixes).

Warm-up requests go straight to the engine, not through the scheduler: they write no
result rows and do not count in the stats. Each prompt is sent ``rounds`` times, one
round after the other, so later rounds find the stable prefixes in the prefix cache.

Then :func:`calibrate` measures the engine once alone and once at its full batch
(``warmup.calibrate``): the time to first token and per output token at each size seed
the scheduler's service model, so deadline-aware admission is informed from the first
request (not only after the first ones finished, or timed out, in a full batch) and the
cost of a small batch, which a busy engine seldom shows, is measured, not assumed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from dataclasses import dataclass

from sidecar.config import WarmupConfig
from sidecar.engines import Engine, EngineRequest
from sidecar.exceptions import EngineStartError

logger = logging.getLogger(__name__)


async def _generate(engine: Engine, request: EngineRequest) -> int:
    tokens = 0
    async for progress in engine.generate(request):
        tokens = progress.output_tokens
    return tokens


@dataclass(frozen=True)
class SpeedSample:
    """One calibration generation: the batch it ran in, its TTFT and TPOT (seconds)."""

    batch: int
    ttft_s: float
    tpot_s: float | None


async def _timed(engine: Engine, request: EngineRequest, batch: int) -> SpeedSample:
    started = time.monotonic()
    first = last = None
    tokens = 0
    async for progress in engine.generate(request):
        if progress.output_tokens > tokens:
            last = time.monotonic()
            first = first or last
            tokens = progress.output_tokens
    if first is None:
        raise EngineStartError("a calibration generation produced no token (warmup)")
    tpot = (last - first) / (tokens - 1) if last is not None and tokens > 1 else None
    return SpeedSample(batch, first - started, tpot)


async def calibrate(engine: Engine, config: WarmupConfig, full_batch: int) -> list[SpeedSample]:
    """Time one generation alone, then ``full_batch`` together (``config.calibrate``).

    Returns:
        One :class:`SpeedSample` per generation (empty when calibration is off).
    """
    if not (config.enabled and config.calibrate):
        return []
    [tokens] = engine.encode_prompt([config.prompts[-1] if config.prompts else "Hello!"])
    samples: list[SpeedSample] = []
    started = time.monotonic()
    try:
        async with asyncio.timeout(config.timeout_s):
            for batch in sorted({1, max(full_batch, 1)}):
                samples += await asyncio.gather(*(
                    _timed(engine, EngineRequest(
                        request_id=f"sts-calibrate-{batch}-{i}", prompt_token_ids=tokens,
                        max_tokens=config.calibration_tokens, temperature=0.0, seed=i,
                        priority=0), batch)
                    for i in range(batch)))
    except TimeoutError:
        raise EngineStartError(f"calibration took longer than {config.timeout_s:g} s "
                               "(warmup.timeout_s)") from None
    by_batch = {s.batch: s for s in samples}
    logger.info("Calibration in %.2f s: %s.", time.monotonic() - started, ", ".join(
        f"batch {b}: TTFT {s.ttft_s * 1000:.0f} ms, TPOT "
        f"{s.tpot_s * 1000:.0f} ms" if s.tpot_s is not None else f"batch {b}: TTFT "
        f"{s.ttft_s * 1000:.0f} ms" for b, s in sorted(by_batch.items())))
    return samples


async def warm_up(engine: Engine, config: WarmupConfig) -> float:
    """Run the warm-up on a started engine; return its duration in seconds (0 when off).

    Raises:
        EngineStartError: a warm-up generation failed or the warm-up took longer than
            ``timeout_s``.
    """
    if not config.enabled:
        return 0.0
    texts = config.texts()
    started = time.monotonic()
    try:
        async with asyncio.timeout(config.timeout_s):
            ids = engine.encode_prompt(texts)
            for round_ in range(config.rounds):
                await asyncio.gather(*(
                    _generate(engine, EngineRequest(
                        request_id=f"sts-warmup-{round_}-{i}", prompt_token_ids=tokens,
                        max_tokens=config.max_tokens, temperature=0.0, seed=0, priority=0))
                    for i, tokens in enumerate(ids)))
    except TimeoutError:
        raise EngineStartError(f"warm-up took longer than {config.timeout_s:g} s "
                               "(warmup.timeout_s)") from None
    except Exception as e:
        raise EngineStartError(f"warm-up generation failed: {type(e).__name__}: {e} "
                               "(warmup)") from e
    elapsed = time.monotonic() - started
    logger.info("Warm-up: %d generations (%d prompts x %d rounds) in %.2f s.",
                len(texts) * config.rounds, len(texts), config.rounds, elapsed)
    return elapsed
