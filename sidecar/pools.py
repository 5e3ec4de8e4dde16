"""Priority pools and the dispatch policy that chooses between them.

Each priority has a :class:`Pool`: a FIFO queue plus counters of what the pool
has inside the engine. :class:`WeightedPicker` decides which pool's head goes
next when an engine slot frees: smooth weighted round robin (the nginx
upstream algorithm) over the pools that have work and room. With weights
high 8 / normal 3 / low 1 and every pool busy, 8 of every 12 dispatches are
``high`` and ``low`` still gets 1 in 12, so no pool starves; a pool with
nothing queued takes no turns, so ``high`` alone gets every slot.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from sidecar.config import PoolConfig
from sidecar.contract import Priority
from sidecar.request_state import RequestStatus, SidecarRequest
from sidecar.timers import TimerEntry


def slot_free_by(now: float, service_s: float, deadline_in_s: float) -> float:
    """When a request dispatched at ``now`` (monotonic seconds) leaves its engine slot:
    after its estimated ``service_s``, or at its deadline, ``deadline_in_s`` from now, if
    that comes first (it is aborted then, or becomes late work that on-time work may
    abort: either way its slot is free to an on-time request).

    Example:
        >>> slot_free_by(100.0, 30.0, 5.0), slot_free_by(100.0, 30.0, 60.0)
        (105.0, 130.0)
        >>> slot_free_by(100.0, 30.0, -2.0)  # dispatched past its deadline
        100.0
    """
    return now + min(service_s, max(deadline_in_s, 0.0))


@dataclass(slots=True)
class Running:
    """A request inside the engine, as the scheduler sees it."""

    req: SidecarRequest
    started: float
    """Monotonic time it was dispatched."""
    expected_end: float
    """Monotonic time it is expected to leave its slot (:func:`slot_free_by`: dispatch +
    estimated service, or its deadline if sooner)."""
    preemptions: int = 0
    """How many times it was preempted before this run."""
    target_batch: int | None = None
    """While it runs, lower-priority work is held back so at most this many sequences
    run (it needs a small batch to meet its deadline); ``None``: no limit."""
    live: bool = False
    """Its serving task has begun (a task cancelled before it begins runs no cleanup,
    so only live requests are preempted)."""


@dataclass
class Pool:
    """Runtime state of one priority pool."""

    priority: Priority
    config: PoolConfig
    queue: collections.deque[SidecarRequest] = field(default_factory=collections.deque)
    queued: int = 0
    """Requests still waiting (the deque may also hold lazily removed ones)."""
    timers: dict[str, TimerEntry] = field(default_factory=dict)
    """The queue timer of each waiting request (its queue delay or its deadline)."""
    in_flight: int = 0
    tokens_in_flight: int = 0
    running: dict[str, Running] = field(default_factory=dict)
    """The pool's requests inside the engine, by ``request_id``."""
    holding: dict[str, int] = field(default_factory=dict)
    """Target batch of each running request that holds lower work back (few, so reading
    the limit does not walk every running request)."""
    shed_by_reason: collections.Counter[str] = field(default_factory=collections.Counter)
    results_by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    met_deadline: int = 0
    lost_at: float | None = None
    """Monotonic time the pool last lost a request to waiting (it timed out in the
    queue, or was refused for a wait it could not afford): see
    :meth:`~sidecar.load_control.LoadControl.losing`."""

    def push(self, req: SidecarRequest) -> None:
        self.queue.append(req)
        self.queued += 1

    def leave(self, req: SidecarRequest) -> TimerEntry | None:
        """``req`` stops waiting (the deque drops it lazily); returns its queue timer,
        for the caller to cancel."""
        self.queued -= 1
        return self.timers.pop(req.request_id, None)

    def head(self) -> SidecarRequest | None:
        """The oldest request still queued (drops finished ones from the front)."""
        while self.queue and self.queue[0].status is not RequestStatus.QUEUED:
            self.queue.popleft()
        return self.queue[0] if self.queue else None

    def newest_queued(self) -> SidecarRequest | None:
        """The most recent request still queued (drops finished ones from the back)."""
        while self.queue and self.queue[-1].status is not RequestStatus.QUEUED:
            self.queue.pop()
        return self.queue[-1] if self.queue else None

    def position(self, req: SidecarRequest) -> int:
        """Requests still queued before ``req`` (which is queued), counted from the head
        (asked once per request, when it has waited ``max_queue_delay_ms``)."""
        ahead = 0
        for queued in self.queue:
            if queued is req:
                return ahead
            if queued.status is RequestStatus.QUEUED:
                ahead += 1
        return ahead

    def has_room_for(self, req: SidecarRequest) -> bool:
        """Whether the pool's in-engine limits allow ``req`` to start now."""
        if self.in_flight >= self.config.max_in_flight:
            return False
        if self.in_flight == 0:
            return True  # a lone oversized request must not wait forever
        return self.tokens_in_flight + req.token_footprint <= self.config.max_tokens_in_flight

    def started(self, req: SidecarRequest, running: Running | None = None) -> None:
        self.in_flight += 1
        self.tokens_in_flight += req.token_footprint
        if running is not None:
            self.running[req.request_id] = running
            if running.target_batch is not None:
                self.holding[req.request_id] = running.target_batch

    def stopped(self, req: SidecarRequest) -> None:
        self.in_flight -= 1
        self.tokens_in_flight -= req.token_footprint
        self.running.pop(req.request_id, None)
        self.holding.pop(req.request_id, None)

    def push_front(self, req: SidecarRequest) -> None:
        """Queue ``req`` again ahead of everything queued (a preempted request keeps its
        place: it was dispatched before them)."""
        self.queue.appendleft(req)
        self.queued += 1


class WeightedPicker:
    """Smooth weighted round robin over the pools offered at each pick.

    Example:
        >>> picker = WeightedPicker({Priority.HIGH: 2, Priority.LOW: 1})
        >>> [str(picker.pick([Priority.HIGH, Priority.LOW])) for _ in range(3)]
        ['high', 'low', 'high']
    """

    def __init__(self, weights: dict[Priority, int]) -> None:
        self.weights = dict(weights)
        self._current = {p: 0 for p in weights}

    def pick(self, candidates: list[Priority]) -> Priority:
        """Choose one of ``candidates`` (non-empty); ties go to the higher priority."""
        total = 0
        for p in candidates:
            self._current[p] += self.weights[p]
            total += self.weights[p]
        chosen = max(candidates, key=lambda p: (self._current[p], -int(p)))
        self._current[chosen] -= total
        return chosen

    def forget(self, priority: Priority) -> None:
        """Reset a pool's credit when it runs dry, so idle time earns no burst later."""
        self._current[priority] = 0
