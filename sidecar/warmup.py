"""Warm-up before ``SERVING``: a few short generations so the first real requests do not
pay the cold start (first kernels and allocations, the tokenizer, the chat template,
and the prefix cache for the configured stable prefixes).

Warm-up requests go straight to the engine, not through the scheduler: they write no
result rows and do not count in the stats. Each prompt is sent ``rounds`` times, one
round after the other, so later rounds find the stable prefixes in the prefix cache.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sidecar.config import WarmupConfig
from sidecar.engines import Engine, EngineRequest
from sidecar.exceptions import EngineStartError

logger = logging.getLogger(__name__)


async def _generate(engine: Engine, request: EngineRequest) -> int:
    tokens = 0
    async for progress in engine.generate(request):
        tokens = progress.output_tokens
    return tokens


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
