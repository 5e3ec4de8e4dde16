"""The requests a traffic profile or a production trace generates, and their Spark event rows.

:func:`generate` turns a :class:`~sts_capacity.profiles.TrafficProfile` into
concrete requests: output lengths are drawn from the real distribution, about
1 % of them deliberately very long, and become each request's ``max_tokens``
(never one fixed value: DESIGN.md pitfall 5). Prompts put a stable prefix first
(pitfall 3). :func:`events_for_spark` turns them into the rows the Spark
pipeline's file source reads.

Example:
    >>> from sts_capacity.profiles import load_profile
    >>> profile = load_profile("cpu-small")
    >>> reqs = generate(profile, duration_s=10, seed=1)
    >>> all(r.prompt.startswith(profile.stable_prefix) for r in reqs)
    True
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from sts_capacity.profiles import TrafficProfile
from sts_capacity.trace import Trace

logger = logging.getLogger(__name__)

# Per-event filler; sentences are drawn at random to pad a ticket to its target length.
_TICKET_SENTENCES: tuple[str, ...] = (
    "My order has not arrived yet and the tracking page has not changed for four days.",
    "The headphones I bought last month stopped charging after a week.",
    "I was charged twice for the same order, please refund one of the payments.",
    "Someone changed the email address on my account without my permission.",
    "The parcel arrived damaged and two of the glasses inside are broken.",
    "Can I change the delivery address? I am moving at the end of the week.",
    "The discount code from your newsletter is rejected at checkout.",
    "I returned the jacket three weeks ago and still have not received my money.",
    "The size guide says medium but the shirt is far too small.",
    "Your app logs me out every time I open the order history.",
    "I would like to cancel my subscription before the next billing date.",
    "The invoice shows the wrong company name, I need a corrected copy.",
    "The courier left the package at a neighbour I do not know.",
    "Is the blue version of this backpack coming back in stock soon?",
    "I received someone else's order, what should I do with it?",
    "The warranty card is missing from the box of my coffee machine.",
)


@dataclass
class GeneratedRequest:
    """One request drawn from a profile."""

    index: int
    """Arrival order, from 0."""

    arrival_s: float
    """Seconds after the start of the run."""

    priority: str
    """``high``, ``normal`` or ``low``."""

    input_tokens: int
    """Target prompt length in tokens (the prompt has about ``input_tokens * chars_per_token``
    characters)."""

    max_tokens: int
    """Sampled output length, sent as ``max_tokens``."""

    sla_ms: int
    """Deadline after arrival, in ms."""

    prompt: str
    """``stable_prefix + content``: the full prompt."""

    content: str
    """The per-event part of the prompt (what a Spark event's ``text`` carries)."""


def _filler(rng: np.random.Generator, longest: int) -> tuple[str, np.ndarray]:
    """Random ticket sentences joined by spaces, at least ``longest`` characters past any of
    the returned start offsets (the first 256 sentence starts)."""
    shortest = min(len(s) for s in _TICKET_SENTENCES) + 1
    n = 256 + longest // shortest + 1
    picks = [_TICKET_SENTENCES[i] for i in rng.integers(0, len(_TICKET_SENTENCES), size=n)]
    starts = np.cumsum([0] + [len(s) + 1 for s in picks[:255]])
    return " ".join(picks), starts


def generate(profile: TrafficProfile, duration_s: float, seed: int = 0
             ) -> list[GeneratedRequest]:
    """Draw the requests that arrive in ``duration_s`` seconds of ``profile``'s traffic.

    Arrival times, priorities, input and output lengths and prompt text all come
    from one ``np.random.default_rng(seed)``, so a seed gives the same list
    every time. Each prompt is ``profile.stable_prefix`` followed by
    ``"(ref <index>) "`` and random ticket sentences, cut so the whole prompt
    has about ``input_tokens * chars_per_token`` characters (never less than
    the prefix plus the reference).

    Args:
        profile: The traffic profile.
        duration_s: Length of the run in seconds.
        seed: Random seed.

    Returns:
        Requests sorted by arrival.

    Example:
        >>> from sts_capacity.profiles import load_profile
        >>> reqs = generate(load_profile("seed-200qps"), duration_s=1, seed=0)
        >>> len({r.max_tokens for r in reqs}) > 10
        True
    """
    rng = np.random.default_rng(seed)
    times = profile.arrivals.arrival_times(rng, duration_s)
    n = len(times)
    names = list(profile.priority_mix)
    prio = rng.choice(len(names), size=n, p=[profile.priority_mix[p] for p in names])
    inputs = profile.input_tokens.sample(rng, n)
    outputs = profile.output_tokens.sample(rng, n)
    out = _requests(profile, rng, [float(t) for t in times], [names[k] for k in prio],
                    [int(x) for x in inputs], [int(x) for x in outputs])
    logger.debug("Generated %s requests from profile %s (seed %s).", n, profile.name, seed)
    return out


def _requests(profile: TrafficProfile, rng: np.random.Generator, times: list[float],
              priorities: list[str], inputs: list[int], outputs: list[int]
              ) -> list[GeneratedRequest]:
    """The requests with these arrival times, priorities and lengths: each prompt the
    profile's stable prefix, a reference and ticket sentences up to its input length."""
    targets = np.rint(np.asarray(inputs, dtype=np.float64) * profile.chars_per_token
                      ).astype(np.int64)
    filler, starts = _filler(rng, int(targets.max(initial=0)))
    offsets = starts[rng.integers(0, len(starts), size=len(times))]
    prefix = profile.stable_prefix
    out = []
    for i, (arrival, priority) in enumerate(zip(times, priorities)):
        ref = f"(ref {i:07d}) "
        body = max(0, int(targets[i]) - len(prefix) - len(ref))
        content = ref + filler[offsets[i]:offsets[i] + body]
        out.append(GeneratedRequest(
            index=i, arrival_s=arrival, priority=priority, input_tokens=inputs[i],
            max_tokens=outputs[i], sla_ms=profile.sla_ms[priority], prompt=prefix + content,
            content=content))
    return out


@dataclass(frozen=True)
class TraceCaps:
    """Lengths of a trace beyond what the run's engine takes, cut to its caps: reported
    with the run, never silently."""

    input_tokens: int | None
    output_tokens: int | None
    inputs_capped: int
    outputs_capped: int


def from_trace(trace: Trace, profile: TrafficProfile, *, rate: float, duration_s: float,
               seed: int = 0, max_input_tokens: int | None = None,
               max_output_tokens: int | None = None
               ) -> tuple[list[GeneratedRequest], TraceCaps]:
    """The requests of ``trace`` scaled to a mean of ``rate`` requests/s and cut to its
    first ``duration_s`` seconds: each its own arrival time (the bursts kept, scaled),
    its own prompt length and its own output length as ``max_tokens`` (at least 1).
    Priorities: the trace's own where it has them, else drawn by the profile's
    ``priority_mix`` from ``seed``; SLAs, the stable prefix and characters per token are
    the profile's. Lengths above ``max_input_tokens`` / ``max_output_tokens`` are cut and
    counted in the returned :class:`TraceCaps`.

    Example:
        >>> from sts_capacity.profiles import load_profile
        >>> from sts_capacity.trace import Trace, TraceRequest
        >>> trace = Trace("t", tuple(TraceRequest(s, 50, 900 if s == 3 else 9)
        ...                          for s in range(10)))
        >>> reqs, caps = from_trace(trace, load_profile("cpu-small"), rate=2, duration_s=2,
        ...                         max_output_tokens=100)
        >>> [(r.arrival_s, r.max_tokens) for r in reqs], caps.outputs_capped
        ([(0.0, 9), (0.5, 9), (1.0, 9), (1.5, 100)], 1)
    """
    rows = trace.scaled(rate=rate).window(0.0, duration_s).requests
    rng = np.random.default_rng(seed)
    names = list(profile.priority_mix)
    drawn = rng.choice(len(names), size=len(rows), p=[profile.priority_mix[p] for p in names])

    def cut(value: int, cap: int | None) -> int:
        return value if cap is None else min(value, cap)

    inputs = [cut(r.input_tokens, max_input_tokens) for r in rows]
    outputs = [max(1, cut(r.output_tokens, max_output_tokens)) for r in rows]
    caps = TraceCaps(max_input_tokens, max_output_tokens,
                     sum(r.input_tokens > cut(r.input_tokens, max_input_tokens) for r in rows),
                     sum(r.output_tokens > cut(r.output_tokens, max_output_tokens)
                         for r in rows))
    priorities = [r.priority or names[k] for r, k in zip(rows, drawn)]
    return _requests(profile, rng, [r.arrival_s for r in rows], priorities, inputs,
                     outputs), caps


def events_for_spark(requests: list[GeneratedRequest], start_epoch_ms: int, *,
                     id_prefix: str | None = None, include_prefix: bool = False
                     ) -> list[dict[str, Any]]:
    """Event rows for the Spark pipeline's JSON file source.

    Rows have the shape of :data:`sts_harness.replay.EVENT_SCHEMA` (``event_id``,
    ``text``, ``priority``, ``event_ts``, ``max_tokens``); replay them with
    :class:`sts_harness.replay.EventReplayer`.

    Args:
        requests: From :func:`generate`.
        start_epoch_ms: Wall-clock time of arrival 0; ``event_ts`` is
            ``start_epoch_ms + round(arrival_s * 1000)``.
        id_prefix: ``event_id`` is ``f"{id_prefix}-{index:07d}"``; default
            ``f"gen{start_epoch_ms}"``, so runs started at different times do not
            reuse ids (the pipeline derives ``request_id`` from ``event_id`` and the
            sidecar drops replayed ids).
        include_prefix: ``text`` is the whole prompt; by default it is only the
            per-event ``content``, because the pipeline's template adds its own
            stable prefix.

    Returns:
        One dict per request, in arrival order.

    Example:
        >>> from sts_capacity.profiles import load_profile
        >>> reqs = generate(load_profile("cpu-small"), duration_s=5, seed=0)
        >>> sorted(events_for_spark(reqs, 0)[0])
        ['event_id', 'event_ts', 'max_tokens', 'priority', 'text']
    """
    prefix = f"gen{start_epoch_ms}" if id_prefix is None else id_prefix
    return [{"event_id": f"{prefix}-{r.index:07d}",
             "text": r.prompt if include_prefix else r.content,
             "priority": r.priority,
             "event_ts": int(start_epoch_ms) + int(round(r.arrival_s * 1000)),
             "max_tokens": r.max_tokens} for r in requests]
