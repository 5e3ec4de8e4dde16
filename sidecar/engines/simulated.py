"""The ``simulated`` engine: a timing model of a continuous-batching GPU engine.

For load tests and capacity planning at a scale this machine cannot reach. It
generates no text (answers read ``[simulated] ...``) and is always labelled
``simulated`` in stats and results. The model, per engine step:

* admit waiting sequences (priority, then arrival) while the batch has fewer
  than ``max_num_seqs`` and their KV footprint fits ``kv_capacity_tokens``;
* the step lasts ``step_base_ms + step_per_seq_ms * batch`` plus the prefill of
  newly admitted prompts at ``prefill_tokens_per_s`` (with ``max_num_batched_tokens``,
  chunked as vLLM V1 does: at most that many tokens a step, a long prompt over several);
* every running sequence emits one token; a sequence ends after ``max_tokens``;
* a prefix cache of whole KV blocks (``block_size`` tokens, chained hashes as in vLLM,
  the ``prefix_cache_blocks`` most recently used kept): an admitted prompt's leading
  blocks found there are not prefilled again and count as ``cached_tokens``, and the
  engine's hit and lookup counters feed the prefix-cache hit rate.

It is deterministic: the same arrivals give the same timings (up to the event
loop's timer accuracy).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.contract import FinishReason
from sidecar.engines.base import Engine, EngineProgress, EngineRequest, EngineStats
from sidecar.exceptions import EngineDeadError

if TYPE_CHECKING:
    from sidecar.config import EngineConfig

logger = logging.getLogger(__name__)


@dataclass
class SimulatedEngineConfig:
    """Timing parameters. Defaults approximate a 7-8B model on one H100-class GPU
    (about 3,400 output tokens/s at batch 64)."""

    max_num_seqs: int = 64
    """Most sequences decoded together (vLLM ``max_num_seqs``)."""

    step_base_ms: float = 12.0
    """Fixed cost of one decode step, milliseconds."""

    step_per_seq_ms: float = 0.08
    """Added step cost per running sequence, milliseconds."""

    prefill_tokens_per_s: float = 20_000.0
    """Prompt tokens processed per second when a sequence is admitted."""

    max_num_batched_tokens: int = 0
    """Chunked prefill (vLLM V1's scheduler; ``max_num_batched_tokens``, 8,192 for an API
    server on an H100): at most this many tokens per step, one per decoding sequence and
    the rest prompt chunks, first to the sequences admitted first, so a long prompt is
    prefilled over several steps and no step waits for whole prompts. A sequence's first
    token comes with the step that ends its prefill. 0: every prompt admitted is
    prefilled whole in the step it is admitted in (no chunking)."""

    kv_capacity_tokens: int = 200_000
    """KV cache size in tokens (prompt plus ``max_tokens`` of each running sequence)."""

    chars_per_token: float = 4.0
    """Tokenizer stand-in: prompt tokens = characters / this."""

    block_size: int = 16
    """Tokens per KV block; the prefix cache keeps and finds whole blocks only (vLLM's
    default on GPU)."""

    prefix_cache_blocks: int = 8192
    """Prompt blocks the prefix cache keeps, least recently used dropped first (8192
    blocks of 16 = 131,072 tokens); 0: no prefix caching."""

    model_name: str = "simulated-llm"
    """Name reported as the served model."""

    text: str = "[simulated] {tokens} tokens"
    """The answer text (``{tokens}``: tokens generated); tests of what the Spark side does
    with an answer's content set it."""

    progress_every: int = 0
    """Output tokens between a sequence's progress reports; 0: its first token and its
    end only (cheap at seed scale). vLLM reports every step (1): the scheduler's check of
    a running request against its deadline reads these (``SLOW_CPU`` sets 1)."""
    replicas: int = 1
    """Independent GPUs behind this sidecar (a simulated cluster for seed-scale runs);
    each request goes to the replica with the fewest sequences."""

    fail_after_s: float | None = None
    """Fault drill: the engine dies this many seconds after it started (every stream
    raises :class:`~sidecar.exceptions.EngineDeadError`, :meth:`SimulatedEngine.failure`
    reports it), so supervisors and health checks can be tried. ``None``: never."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"{self.max_num_seqs=} must be >= 1")
        if self.step_base_ms <= 0 or self.step_per_seq_ms < 0:
            raise ValueError(f"{self.step_base_ms=} must be > 0 and {self.step_per_seq_ms=} >= 0")
        if self.progress_every < 0:
            raise ValueError(f"{self.progress_every=} must be >= 0")
        if self.replicas < 1:
            raise ValueError(f"{self.replicas=} must be >= 1")
        if self.fail_after_s is not None and self.fail_after_s < 0:
            raise ValueError(f"{self.fail_after_s=} must be >= 0 or None")
        if self.block_size < 1 or self.prefix_cache_blocks < 0:
            raise ValueError(f"{self.block_size=} must be >= 1 and "
                             f"{self.prefix_cache_blocks=} >= 0")
        if self.max_num_batched_tokens < 0:
            raise ValueError(f"{self.max_num_batched_tokens=} must be >= 0")
        if self.prefill_tokens_per_s <= 0 or self.kv_capacity_tokens < 1:
            raise ValueError(
                f"{self.prefill_tokens_per_s=} and {self.kv_capacity_tokens=} must be positive"
            )

    def step_seconds(self, batch: int) -> float:
        """Duration of one decode step with ``batch`` running sequences."""
        return (self.step_base_ms + self.step_per_seq_ms * batch) / 1000.0


#: A slow CPU's engine: SmolLM2-135M on vLLM's CPU build on a 2-vCPU AMD EPYC (AVX2 only,
#: no AVX-512), whose calibration measured a time per output token of 99 ms alone and
#: 154 ms in a batch of 8 (TTFT 187 and 602 ms), about 10 output tokens/s for one
#: sequence where a machine with AVX-512 makes 35-40. The step cost fits both TPOTs
#: (91.1 + 7.86 x batch ms); the prefill rate is a CPU's, not measured. So a fast
#: development machine sees what a slow laptop does (``engine.simulated`` settings, e.g.
#: ``benchmarks.overload --slow-cpu``).
SLOW_CPU: dict[str, float | int] = {"max_num_seqs": 8, "step_base_ms": 91.1,
                                    "step_per_seq_ms": 7.86, "prefill_tokens_per_s": 800.0,
                                    "progress_every": 1}


def simulated_set_args(settings: dict[str, float | int]) -> list[str]:
    """``sts sidecar`` arguments that run the simulated engine with ``settings``.

    Example:
        >>> simulated_set_args({"step_base_ms": 91.1})[:4]
        ['--engine', 'simulated', '--set', 'engine.simulated.step_base_ms=91.1']
    """
    args = ["--engine", "simulated"]
    for key, value in settings.items():
        args += ["--set", f"engine.simulated.{key}={value}"]
    return args


class _SimSeq:
    """One sequence and its output channel (a deque plus a future the consumer,
    :class:`_SimStream`, awaits when it is empty: cheaper than an ``asyncio.Queue`` per
    request)."""

    __slots__ = ("request", "out", "waiter", "generated", "footprint", "error", "cached",
                 "to_prefill")

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.out: collections.deque[EngineProgress] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.generated = 0
        self.footprint = len(request.prompt_token_ids) + request.max_tokens
        self.error: BaseException | None = None
        self.cached = 0
        self.to_prefill = 0
        """Prompt tokens not prefilled yet (it decodes once this is 0)."""

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error`` (raised once the outputs before it are read)."""
        self.error = error
        if (waiter := self.waiter) is not None and not waiter.done():
            waiter.set_result(None)

    def put(self, item: EngineProgress) -> None:
        self.out.append(item)
        if (waiter := self.waiter) is not None and not waiter.done():
            waiter.set_result(None)


class _SimStream:
    """The consumer's side of one sequence. A plain async iterator, not an async
    generator: the loop's per-generator bookkeeping costs as much as the rest of
    the stream. An exception in the consumer's wait (its cancel) drops the sequence."""

    __slots__ = ("_engine", "_seq", "_done")

    def __init__(self, engine: "SimulatedEngine", seq: _SimSeq) -> None:
        self._engine = engine
        self._seq = seq
        self._done = False

    def __aiter__(self) -> "_SimStream":
        return self

    async def __anext__(self) -> EngineProgress:
        if self._done:
            raise StopAsyncIteration
        seq = self._seq
        out = seq.out
        try:
            while not out:  # no item yet: wait for one (or for the error)
                if seq.error is not None:
                    raise seq.error
                seq.waiter = asyncio.get_running_loop().create_future()
                try:
                    await seq.waiter
                finally:
                    seq.waiter = None
        except BaseException:
            self._done = True
            self._engine._drop(seq)
            raise
        item = out.popleft()
        if item.finished:
            self._done = True
        return item


class SimulatedEngine(Engine):
    """Continuous-batching timing model behind the :class:`Engine` interface.

    Example:
        >>> engine = SimulatedEngine(SimulatedEngineConfig(max_num_seqs=8))
        >>> engine.model_name
        'simulated-llm'
    """

    kind = "simulated"

    @classmethod
    def from_config(cls, config: "EngineConfig") -> Engine:
        """One simulated GPU, or :class:`SimulatedCluster` for ``replicas`` > 1."""
        sim = SimulatedEngineConfig(**config.simulated)
        engine_class = SimulatedCluster if sim.replicas > 1 else SimulatedEngine
        return engine_class(sim, served_model_name=config.served_model_name)

    def __init__(self, config: SimulatedEngineConfig | None = None, *,
                 served_model_name: str | None = None) -> None:
        self.config = config or SimulatedEngineConfig()
        self._model_name = served_model_name or self.config.model_name
        self._waiting: list[tuple[int, int, _SimSeq]] = []
        self._running: dict[str, _SimSeq] = {}
        self._kv_used = 0
        self._prefilling = 0
        """Running sequences whose prompt is not wholly prefilled yet."""
        self._arrivals = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: str | None = None
        self._fail_timer: asyncio.TimerHandle | None = None
        self.max_model_len = 1 << 20
        self._prefix_cache: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._prefix_queries = 0
        self._prefix_hits = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._step_loop(), name="simulated-engine")
            if (after := self.config.fail_after_s) is not None:
                self._fail_timer = asyncio.get_running_loop().call_later(
                    after, self.fail, f"simulated engine failure after {after:g} s (fail_after_s)")

    def encode_prompt(self, prompts: list[str]) -> list[list[int]]:
        """Stand-in token ids: one per ``chars_per_token`` characters; with prefix
        caching on, the first id of each whole block is a hash of the block's text, so
        equal leading text gives equal blocks."""
        per = self.config.chars_per_token
        if not self.config.prefix_cache_blocks:
            return [list(range(max(1, int(len(p) / per)))) for p in prompts]
        bs = self.config.block_size
        span = bs * per
        out = []
        for p in prompts:
            ids = list(range(max(1, int(len(p) / per))))
            for b in range(len(ids) // bs):
                ids[b * bs] = hash(p[int(b * span):int((b + 1) * span)])
            out.append(ids)
        return out

    def _lookup_and_cache(self, ids: list[int]) -> int:
        """Prompt tokens found in the prefix cache (whole leading blocks; the last token
        is always computed, as in vLLM); the prompt's blocks are cached from now on."""
        cfg = self.config
        bs, cache = cfg.block_size, self._prefix_cache
        found, chain, hit = 0, 0, True
        for b in range(len(ids) // bs):
            chain = hash((chain, tuple(ids[b * bs:(b + 1) * bs])))
            if hit and chain in cache and (b + 1) * bs < len(ids):
                cache.move_to_end(chain)
                found += bs
                continue
            hit = False
            cache[chain] = None
            cache.move_to_end(chain)
        while len(cache) > cfg.prefix_cache_blocks:
            cache.popitem(last=False)
        self._prefix_queries += len(ids)
        self._prefix_hits += found
        return found

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineProgress]:
        if self._task is None:
            raise RuntimeError("SimulatedEngine.start() was not awaited")
        seq = _SimSeq(request)
        if self._failure is not None:
            seq.fail(EngineDeadError(self._failure))
            return _SimStream(self, seq)
        heapq.heappush(self._waiting, (request.priority, next(self._arrivals), seq))
        self._wake.set()
        return _SimStream(self, seq)

    def _drop(self, seq: _SimSeq) -> None:
        """Abort: forget the sequence wherever it is (no-op once it finished)."""
        if seq.generated >= seq.request.max_tokens:
            return
        if self._running.pop(seq.request.request_id, None) is seq:
            self._kv_used -= seq.footprint
            if seq.to_prefill:
                self._prefilling -= 1
        else:
            self._waiting = [w for w in self._waiting if w[2] is not seq]
            heapq.heapify(self._waiting)

    def failure(self) -> str | None:
        return self._failure

    def fail(self, why: str) -> None:
        """Die now, as a crashed GPU worker would: the step loop stops, every stream
        raises :class:`~sidecar.exceptions.EngineDeadError`, :meth:`failure` says ``why``."""
        if self._failure is not None:
            return
        self._failure = why
        logger.error("Simulated engine died: %s", why)
        if self._task is not None:
            self._task.cancel()
        error = EngineDeadError(why)
        for seq in [*self._running.values(), *(w[2] for w in self._waiting)]:
            seq.fail(error)
        self._running.clear()
        self._prefilling = 0
        self._waiting.clear()
        self._kv_used = 0

    def stats(self) -> EngineStats:
        return EngineStats(
            kv_cache_usage=self._kv_used / self.config.kv_capacity_tokens,
            running=len(self._running),
            waiting=len(self._waiting),
            prefix_cache_queries=self._prefix_queries if self.config.prefix_cache_blocks else None,
            prefix_cache_hits=self._prefix_hits if self.config.prefix_cache_blocks else None,
        )

    async def _step_loop(self) -> None:
        cfg = self.config
        # The answer text per output length, formatted once (the engine stands in for a
        # GPU, whose work is not the sidecar's CPU).
        texts: dict[int, str] = {}
        template = cfg.text
        every = cfg.progress_every
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            while self._waiting and len(self._running) < cfg.max_num_seqs:
                seq = self._waiting[0][2]
                if self._running and self._kv_used + seq.footprint > cfg.kv_capacity_tokens:
                    break
                heapq.heappop(self._waiting)
                self._running[seq.request.request_id] = seq
                self._kv_used += seq.footprint
                ids = seq.request.prompt_token_ids
                if cfg.prefix_cache_blocks:
                    seq.cached = self._lookup_and_cache(ids)
                seq.to_prefill = len(ids) - seq.cached
                self._prefilling += 1
            batch = len(self._running)
            prefill_tokens = self._prefill_step(batch) if self._prefilling else 0
            await asyncio.sleep(cfg.step_seconds(batch) + prefill_tokens / cfg.prefill_tokens_per_s)
            if cfg.text is not template:
                texts.clear()
                template = cfg.text
            for rid, seq in list(self._running.items()):
                if seq.to_prefill:
                    continue  # its prompt is still being prefilled
                seq.generated += 1
                done = seq.generated >= seq.request.max_tokens
                if seq.generated == 1 or done or (
                        every and seq.generated % every == 0):
                    text = ""
                    if done and (text := texts.get(seq.generated)) is None:
                        if len(texts) > 4096:
                            texts.clear()
                        text = texts[seq.generated] = cfg.text.format(tokens=seq.generated)
                    seq.put(EngineProgress(text, seq.generated, seq.cached, done,
                                           FinishReason.LENGTH if done else None))
                if done:
                    del self._running[rid]
                    self._kv_used -= seq.footprint

    def _prefill_step(self, batch: int) -> int:
        """Prefill this step's prompt chunks, first to the sequences admitted first:
        whole prompts without chunking, else what ``max_num_batched_tokens`` leaves after
        one token per decoding sequence. Returns the tokens prefilled."""
        budget = self.config.max_num_batched_tokens
        if budget:
            budget -= batch - self._prefilling  # one token per decoding sequence
        done = 0
        for seq in self._running.values():
            if not seq.to_prefill:
                continue
            chunk = seq.to_prefill if not self.config.max_num_batched_tokens \
                else min(seq.to_prefill, max(budget - done, 0))
            if chunk <= 0:
                break
            seq.to_prefill -= chunk
            done += chunk
            if not seq.to_prefill:
                self._prefilling -= 1
        return done

    async def shutdown(self) -> None:
        if timer := self._fail_timer:
            self._fail_timer = None
            timer.cancel()
        if task := self._task:
            self._task = None
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


class SimulatedCluster(Engine):
    """``replicas`` independent :class:`SimulatedEngine` GPUs behind one interface;
    each request goes to the replica with the fewest running plus waiting sequences."""

    kind = "simulated"

    def __init__(self, config: SimulatedEngineConfig, *,
                 served_model_name: str | None = None) -> None:
        self.config = config
        self.replicas = [SimulatedEngine(config, served_model_name=served_model_name)
                         for _ in range(config.replicas)]
        self.batches = len(self.replicas)
        self.max_model_len = self.replicas[0].max_model_len

    @property
    def model_name(self) -> str:
        return self.replicas[0].model_name

    async def start(self) -> None:
        for replica in self.replicas:
            await replica.start()

    def encode_prompt(self, prompts: list[str]) -> list[list[int]]:
        return self.replicas[0].encode_prompt(prompts)

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineProgress]:
        target = min(self.replicas, key=lambda r: len(r._running) + len(r._waiting))
        return target.generate(request)

    def failure(self) -> str | None:
        return next((why for r in self.replicas if (why := r.failure()) is not None), None)

    def stats(self) -> EngineStats:
        parts = [r.stats() for r in self.replicas]
        return EngineStats(
            kv_cache_usage=sum(p.kv_cache_usage or 0.0 for p in parts) / len(parts),
            running=sum(p.running or 0 for p in parts),
            waiting=sum(p.waiting or 0 for p in parts),
            prefix_cache_queries=(None if not self.config.prefix_cache_blocks
                                  else sum(p.prefix_cache_queries or 0 for p in parts)),
            prefix_cache_hits=(None if not self.config.prefix_cache_blocks
                               else sum(p.prefix_cache_hits or 0 for p in parts)),
        )

    async def shutdown(self) -> None:
        for replica in self.replicas:
            await replica.shutdown()
