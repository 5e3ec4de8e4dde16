"""The ``vllm`` engine: vLLM's ``AsyncLLM`` in the sidecar process.

Uses vLLM's own priority scheduling (``scheduling_policy="priority"``),
automatic prefix caching and ``abort()`` (cancelling the consumer of
:meth:`VllmEngine.generate` aborts the request inside vLLM). On a CPU build the
defaults are fp32 and ``enforce_eager=True`` (measured: 27 s start instead of 92 s,
same decode speed).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sidecar.config import EngineConfig
from sidecar.contract import FinishReason
from sidecar.engines.base import Engine, EngineProgress, EngineRequest, EngineStats
from sidecar.exceptions import EngineDeadError, EngineStartError

logger = logging.getLogger(__name__)


class _EngineCounters:
    """What vLLM's scheduler reports each step, kept for :meth:`VllmEngine.stats`."""

    def __init__(self) -> None:
        self.kv_cache_usage: float | None = None
        self.running: int | None = None
        self.waiting: int | None = None
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def record(self, scheduler_stats: Any) -> None:
        self.kv_cache_usage = scheduler_stats.kv_cache_usage
        self.running = scheduler_stats.num_running_reqs
        self.waiting = scheduler_stats.num_waiting_reqs
        if (prefix := scheduler_stats.prefix_cache_stats) is not None and not prefix.reset:
            self.prefix_cache_queries += prefix.queries
            self.prefix_cache_hits += prefix.hits


def _stat_logger_factory(counters: _EngineCounters) -> Any:
    """A per-engine vLLM stat logger that feeds ``counters`` (vLLM's documented
    extension point for custom metrics; its stats classes are not a stable API,
    so only a few long-standing fields are read)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _CounterStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                counters.record(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return lambda vllm_config, engine_index=0: _CounterStatLogger(vllm_config, engine_index)


#: vLLM's finish reasons as ours (anything else that ends a stream counts as ``stop``).
_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH,
                   "abort": FinishReason.ABORT}

_PLACEHOLDER = "\x00STS_PROMPT\x00"


def _default_engine_args(model: str) -> dict[str, Any]:
    import torch

    args: dict[str, Any] = {
        "model": model,
        "scheduling_policy": "priority",
        "enable_prefix_caching": True,
        "max_model_len": 4096,
        "disable_log_stats": False,
    }
    if not torch.cuda.is_available():
        # On CPU "gpu_memory_utilization" reserves a share of host memory; an
        # explicit KV cache size (1 GiB ~ 23k SmolLM2 tokens) is predictable instead.
        args.update(dtype=cpu_dtype(), enforce_eager=True, max_num_seqs=8,
                    kv_cache_memory_bytes=1 << 30)
    return args


def cpu_dtype() -> str:
    """The dtype the CPU engine runs in: ``bfloat16`` where the CPU has bf16 instructions
    (AVX512-BF16; AMX with them) and PyTorch uses its AVX-512 kernels, 1.8x the decode
    speed of ``float32`` at batch 8 on such a CPU; else ``float32`` (on AVX2 kernels
    vLLM's CPU bf16 path fails at the first generation). Measured by
    ``python -m benchmarks.engine_speed``; ``--engine-arg dtype=...``
    overrides it."""
    import torch

    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    return "bfloat16" if avx512 and torch.cpu._is_avx512_bf16_supported() else "float32"


class VllmEngine(Engine):
    """Generation with ``vllm.v1.engine.async_llm.AsyncLLM``.

    Args:
        config: ``config.model`` is a local model folder (default: the prepared
            SmolLM2); ``config.engine_args`` override the ``AsyncEngineArgs`` defaults.

    Usage::

        engine = VllmEngine(EngineConfig(engine_args={"max_num_seqs": 4}))
        await engine.start()
    """

    kind = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.model is None:
            from sidecar.model_prep import default_model_dir, is_prepared

            model_dir = default_model_dir()
            if not is_prepared(model_dir):
                raise EngineStartError(
                    f"the default model is not prepared at {model_dir}; run `sts model prepare`"
                )
            self.model_path = str(model_dir)
        else:
            self.model_path = config.model
        self._model_name = config.served_model_name or Path(self.model_path).name
        self._llm: Any = None
        self._tokenizer: Any = None
        self._template: tuple[str, str] | None = None
        self._counters = _EngineCounters()
        self.max_model_len = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = _default_engine_args(self.model_path)
        args.update(self.config.engine_args)
        logger.info("Starting vLLM engine: %s", args)
        try:
            self._llm = AsyncLLM.from_engine_args(
                AsyncEngineArgs(**args), stat_loggers=[_stat_logger_factory(self._counters)])
        except Exception as e:
            raise EngineStartError(f"vLLM failed to start on {self.model_path}: {e}") from e
        self._tokenizer = self._llm.get_tokenizer()
        self.max_model_len = self._llm.model_config.max_model_len
        if self.config.apply_chat_template:
            self._template = self._split_chat_template()

    def _split_chat_template(self) -> tuple[str, str] | None:
        """Render the chat template once around a placeholder, so each prompt is
        wrapped by string concatenation instead of a Jinja render."""
        tok = self._tokenizer
        if not getattr(tok, "chat_template", None):
            logger.warning("Model has no chat template; prompts are sent raw.")
            return None
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": _PLACEHOLDER}], tokenize=False, add_generation_prompt=True
        )
        if rendered.count(_PLACEHOLDER) != 1:
            raise EngineStartError("chat template does not carry the user message verbatim")
        prefix, suffix = rendered.split(_PLACEHOLDER)
        return prefix, suffix

    def encode_prompt(self, prompts: list[str]) -> list[list[int]]:
        if self._template is not None:
            prefix, suffix = self._template
            prompts = [prefix + p + suffix for p in prompts]
        encoded = self._tokenizer(prompts, add_special_tokens=self._template is None)
        return [list(ids) for ids in encoded["input_ids"]]

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineProgress]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
            ignore_eos=self.config.ignore_eos,
            output_kind=RequestOutputKind.CUMULATIVE,
        )
        prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids)
        try:
            async for out in self._llm.generate(
                prompt, params, request.request_id, priority=request.priority
            ):
                completion = out.outputs[0]
                yield EngineProgress(
                    text=completion.text,
                    output_tokens=len(completion.token_ids),
                    cached_tokens=out.num_cached_tokens or 0,
                    finished=out.finished,
                    finish_reason=(_FINISH_REASONS.get(completion.finish_reason or "",
                                                       FinishReason.STOP)
                                   if out.finished else None),
                )
        except VllmEngineDeadError as e:
            raise EngineDeadError(str(e)) from e

    def failure(self) -> str | None:
        llm = self._llm
        if llm is not None and llm.errored:
            return "the vLLM engine core died"
        return None

    def stats(self) -> EngineStats:
        c = self._counters
        return EngineStats(kv_cache_usage=c.kv_cache_usage, running=c.running, waiting=c.waiting,
                           prefix_cache_queries=c.prefix_cache_queries,
                           prefix_cache_hits=c.prefix_cache_hits)

    async def shutdown(self) -> None:
        if llm := getattr(self, "_llm", None):
            self._llm = None
            llm.shutdown()
