"""Admission step *gate*: does the sidecar take work at all right now?

Not while the engine is dead (``engine_unavailable``) or the sidecar drains
(``draining``), and not when the result channel could not take the request's row
(``results_backlog``): a bounded channel (Kafka) holds at most ``max_buffered`` rows
that the brokers have not acknowledged, and every request that passes the gate will
write one row, now (a refusal) or later (its result), so the gate lets a request
through only while the channel's room, less the rows that queued and running requests
will still write, stays above the channel's reserve. The reserve is for the refusals'
own rows; once it is used up as well, a refusal is answered in its ack alone
(:attr:`~sidecar.acks.Refusal.row` false).

The scheduler's state is read once per batch, as a :class:`GateState` (nothing changes
it while a batch is admitted), and so is the channel's room; each request then takes
one row of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.acks import Refusal
from sidecar.contract import RefusalReason

if TYPE_CHECKING:
    from sidecar.result_channels import ResultChannel

logger = logging.getLogger(__name__)

#: A refusal answered by its ack alone is logged the first time and then every this many.
_LOG_EVERY = 1000


@dataclass(frozen=True, slots=True)
class GateState:
    """The scheduler's state the gate reads, once per batch."""

    engine_error: str | None
    """Why the engine can no longer serve (``None`` while it serves)."""
    draining: bool
    """Whether the sidecar is shutting down."""
    outstanding: int
    """Rows that queued and running requests (late work included) will still write."""


class Gate:
    """Whether the sidecar takes work, batch by batch.

    Args:
        results: The result channel (its room is checked when it is bounded).
    """

    def __init__(self, results: ResultChannel | None) -> None:
        self._results = results if results is not None and results.bounded else None
        self._reserve = self._results.reserve if self._results is not None else 0
        self._closed: Refusal | None = None
        self._free = 0
        """Rows the channel can still take in this batch (bounded channels only)."""
        self.rowless_refusals = 0
        """Refusals answered by their ack alone (the channel had no room for their row)."""

    def open_batch(self, state: GateState) -> None:
        """Take the scheduler's state for the batch about to be admitted."""
        if state.engine_error is not None:
            self._closed = Refusal(RefusalReason.ENGINE_UNAVAILABLE,
                                   f"engine unavailable: {state.engine_error}")
        elif state.draining:
            self._closed = Refusal(RefusalReason.DRAINING, "sidecar is shutting down")
        else:
            self._closed = None
        if self._results is not None:
            self._free = self._results.room() - state.outstanding

    def check(self) -> Refusal | None:
        """The gate's answer for the next request of the batch (each request that gets
        here writes one row, so it takes one row of the channel's room)."""
        if self._results is None:  # unbounded: the files channel
            return self._closed
        free, self._free = self._free, self._free - 1
        if self._closed is None and free > self._reserve:
            return None
        closed = self._closed or Refusal(
            RefusalReason.RESULTS_BACKLOG,
            f"the result channel holds {self._results.stats().buffered} undelivered rows "
            f"(room for {max(free, 0)} more, {self._reserve} kept for refusals)")
        if free > 0:
            return closed
        self.rowless_refusals += 1
        if self.rowless_refusals % _LOG_EVERY == 1:
            logger.warning("The result channel is full: %d refusals so far answered by "
                           "their ack alone (%s).", self.rowless_refusals, closed.reason)
        return Refusal(closed.reason, closed.detail, row=False)
