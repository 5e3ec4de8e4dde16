"""Callers waiting on the scheduler: a blocking call's terminal row, or the moment
nothing is queued or running (:meth:`~sidecar.scheduler.Scheduler.wait_idle`)."""

from __future__ import annotations

import asyncio

from sidecar.request_state import ResultRecord


class Waiters:
    """Futures resolved by the scheduler's completions."""

    def __init__(self) -> None:
        self._results: dict[str, asyncio.Future[ResultRecord]] = {}
        self._idle: list[asyncio.Future[None]] = []
        """Callers of ``wait_idle`` (checked only while there are any: an event cleared
        and set again by every request cost a tenth of its bookkeeping)."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._results

    def result_of(self, request_id: str) -> asyncio.Future[ResultRecord]:
        """A new future for the terminal row of ``request_id``."""
        waiter: asyncio.Future[ResultRecord] = asyncio.get_running_loop().create_future()
        self._results[request_id] = waiter
        return waiter

    def forget(self, request_id: str) -> None:
        """No caller waits on ``request_id`` any more."""
        self._results.pop(request_id, None)

    def finished(self, record: ResultRecord) -> None:
        """``record`` is the terminal row of its request: hand it to its caller."""
        if self._results and (waiter := self._results.pop(record.request_id, None)) \
                and not waiter.done():
            waiter.set_result(record)

    def idle_future(self) -> asyncio.Future[None]:
        """A future resolved by the next :meth:`idle` call."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        return waiter

    def waiting_for_idle(self) -> bool:
        return bool(self._idle)

    def idle(self) -> None:
        """The scheduler is idle: resolve every :meth:`idle_future`."""
        for waiter in self._idle:
            if not waiter.done():
                waiter.set_result(None)
        self._idle.clear()
