"""Admission step *validate*: is the request well formed and within the limits?

Pure functions of the request, the limits and the clock, so they are cheap and easy to
test. :func:`check_request_id` runs first (de-duplication needs the id);
:func:`check_static` needs no tokenizer; :func:`check_prompt_tokens` runs after the
batch of requests that passed has been tokenized. A refusal here is ``rejected``.
"""

from __future__ import annotations

import math

from sidecar.acks import Refusal
from sidecar.config import SchedulerConfig
from sidecar.contract import RefusalReason, attributes_problem
from sidecar.request_state import SidecarRequest

_NO_ID = Refusal(RefusalReason.MISSING_REQUEST_ID, "request_id is required", row=False)


def check_request_id(req: SidecarRequest) -> Refusal | None:
    """A request without ``request_id`` is refused in its ack alone: a result row could
    not be matched to it."""
    return None if req.request_id else _NO_ID


def check_static(req: SidecarRequest, cfg: SchedulerConfig, *, model_names: frozenset[str],
                 now: int) -> Refusal | None:
    """Checks that need no tokenizer (``now``: epoch ms). Returns the first refusal
    found, or ``None``."""
    if req.priority is None:
        return Refusal(RefusalReason.UNKNOWN_PRIORITY,
                       "priority must be PRIORITY_HIGH, PRIORITY_NORMAL or PRIORITY_LOW")
    if not req.prompt or not req.prompt.strip():
        return Refusal(RefusalReason.EMPTY_PROMPT, "prompt is empty")
    if len(req.prompt) > cfg.max_prompt_chars:
        return Refusal(RefusalReason.PROMPT_TOO_LONG,
                       f"prompt has {len(req.prompt)} characters; limit {cfg.max_prompt_chars}")
    if not 1 <= req.max_tokens <= cfg.max_tokens_cap:
        return Refusal(RefusalReason.MAX_TOKENS_OUT_OF_RANGE,
                       f"max_tokens={req.max_tokens} must be in [1, {cfg.max_tokens_cap}]")
    if not (math.isfinite(req.temperature) and 0.0 <= req.temperature <= 2.0):
        return Refusal(RefusalReason.TEMPERATURE_OUT_OF_RANGE,
                       f"temperature={req.temperature} must be in [0, 2]")
    if req.model and req.model not in model_names:
        return Refusal(RefusalReason.UNKNOWN_MODEL,
                       f"model {req.model!r} is not served here (serving {sorted(model_names)})")
    if req.deadline_ts <= 0:
        return Refusal(RefusalReason.DEADLINE_PASSED, "deadline_ts is required (epoch ms)")
    if req.deadline_ts <= now:
        return Refusal(RefusalReason.DEADLINE_PASSED,
                       f"deadline_ts={req.deadline_ts} is {now - req.deadline_ts} ms in the past")
    if req.attributes and (problem := attributes_problem(req.attributes)):
        return Refusal(RefusalReason.ATTRIBUTES_TOO_LARGE, problem)
    return None


def check_prompt_tokens(req: SidecarRequest, cfg: SchedulerConfig, *,
                        max_model_len: int) -> Refusal | None:
    """Checks on the tokenized prompt (``req.prompt_token_ids`` must be set)."""
    n = req.prompt_tokens
    if n > cfg.max_prompt_tokens:
        return Refusal(RefusalReason.PROMPT_TOO_LONG,
                       f"prompt has {n} tokens; limit {cfg.max_prompt_tokens}")
    if n + req.max_tokens > max_model_len:
        return Refusal(RefusalReason.PROMPT_TOO_LONG,
                       f"prompt ({n} tokens) + max_tokens ({req.max_tokens}) exceeds the "
                       f"model's context of {max_model_len} tokens")
    return None
