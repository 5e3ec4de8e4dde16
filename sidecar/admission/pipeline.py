"""The admission pipeline: one ack per request, at once, read top to bottom.

Each request of a ``SubmitBatch`` goes through these steps, each in its own module,
and leaves at the first refusal; none of them does engine work:

1. *validate* the id (:func:`~sidecar.admission.validate.check_request_id`): without
   one, the ack alone refuses it (no row could be matched to it);
2. *dedupe* (:mod:`sidecar.admission.dedupe`): a replayed id is answered with its first
   decision, marked ``duplicate``, and is never generated or reported twice; so this
   runs before the other checks, whose outcome the replay repeats;
3. *gate* (:mod:`sidecar.admission.gate`): the engine is dead (``engine_unavailable``),
   the sidecar drains (``draining``) or the result channel could not take the row
   (``results_backlog``), read from one :class:`~sidecar.admission.gate.GateState` of
   the scheduler per batch;
4. *validate* the rest (:mod:`sidecar.admission.validate`): static checks, then, for
   the batch at once, the tokenized prompt (``rejected``);
5. *load* (:mod:`sidecar.admission.load`): pool full, watermarks, queue delay,
   deadline feasibility (``shed``); a request admitted earlier in the same batch
   counts as queued in its pool for the ones after it
   (:meth:`~sidecar.load_control.LoadControl.admit_pending`).

Nothing here changes the scheduler: :meth:`Admission.decide` returns the batch's
:class:`Decisions` (the acks, the accepted requests in order with their estimated
waits, the refusals that end with a terminal row) and the scheduler applies them: it
queues the accepted ones in their pools and ends the refused ones through its one
place a request becomes terminal. Every decision is remembered for replays.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.admission.dedupe import DedupeWindow, fingerprint
from sidecar.admission.gate import Gate, GateState
from sidecar.admission.load import LoadCheck
from sidecar.acks import Ack, Refusal
from sidecar.admission.validate import check_prompt_tokens, check_request_id, check_static
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, now_ms
from sidecar.request_state import SidecarRequest

if TYPE_CHECKING:
    from sidecar.engines import Engine
    from sidecar.load_control import LoadControl
    from sidecar.result_channels import ResultChannel
    from sidecar.stats import SchedulerCounters

logger = logging.getLogger(__name__)

#: Seconds between two warnings about requests sharing an id (each is counted).
CONFLICT_WARNING_INTERVAL_S = 60.0


@dataclass(slots=True)
class Decisions:
    """What admission decided for one ``SubmitBatch``, for the scheduler to apply."""

    acks: list[Ack] = field(default_factory=list)
    """One per request, in the batch's order."""
    accepted: list[tuple[SidecarRequest, float]] = field(default_factory=list)
    """Requests to queue, in order, each with its estimated queue wait (seconds)."""
    refused: list[tuple[SidecarRequest, Refusal]] = field(default_factory=list)
    """Refusals that end their request with a terminal row (``shed``/``rejected``)."""


def pool_fallback_text(config: SchedulerConfig):
    """The fallback text of a priority's pool (``normal``'s for a request without one)."""
    def fallback_text(priority: Priority | None) -> str:
        return config.pools[str(priority or Priority.NORMAL)].fallback_text
    return fallback_text


class Admission:
    """Decides on each request of a batch; changes nothing outside itself.

    Args:
        config: The scheduler's limits.
        engine: Tokenizes prompts; names the served model.
        load: The scheduler's load model (step 5 reads it).
        counters: The scheduler's counters (submitted, duplicates, refusals without a
            row).
        results: The result channel (the gate checks its room when it is bounded).
    """

    def __init__(self, config: SchedulerConfig, *, engine: Engine, load: LoadControl,
                 counters: SchedulerCounters, results: ResultChannel | None = None) -> None:
        self.config = config
        self.engine = engine
        self.gate = Gate(results)
        self.load = LoadCheck(load)
        self.counters = counters
        self._fallback_text = pool_fallback_text(config)
        self.seen = DedupeWindow(config.dedupe_window, self._fallback_text)
        self._conflict_warned = float("-inf")

    def decide(self, requests: list[SidecarRequest], state: GateState,
               out: Decisions | None = None) -> Decisions:
        """Admit or refuse each request of a batch (``state``: the scheduler's, read once
        for the batch); one ack each, in order. Never waits.

        ``out`` (a new one by default) receives each decision as it is made and
        remembered, so a caller that applies it in a ``finally`` applies every decision
        remembered even when a later step raises (a replay then repeats decisions whose
        rows were written)."""
        now = now_ms()
        out = Decisions() if out is None else out
        acks: list[Ack | None] = [None] * len(requests)
        to_encode: list[int] = []
        model_name = self.engine.model_name
        model_names = frozenset({model_name})  # the one model served
        batch_ids: set[str] = set()
        repeats: list[int] = []
        self.gate.open_batch(state)
        self.counters.submitted += len(requests)
        for i, req in enumerate(requests):
            req.received_ts = now
            if refusal := check_request_id(req):
                self.counters.refused(refusal.reason)
                acks[i] = Ack("", False, refusal.reason, refusal.detail, received_ts=now,
                              fallback_text=self._fallback_text(req.priority))
                continue
            if req.request_id in self.seen or req.request_id in batch_ids:
                self.counters.duplicates += 1
                repeats.append(i)
                continue
            batch_ids.add(req.request_id)
            req.model = req.model or model_name
            if refusal := (self.gate.check()
                           or check_static(req, self.config, model_names=model_names, now=now)):
                acks[i] = self._refuse(req, refusal, out)
                continue
            to_encode.append(i)
        if to_encode:
            self._tokenized(requests, to_encode, acks, out)
        # A replay repeats the first copy's decision (made above if it was in this batch).
        for i in repeats:
            acks[i] = self.seen.replay(requests[i].request_id, now,
                                       fingerprint=fingerprint(requests[i]))
        if repeats:
            self._count_conflicts([acks[i] for i in repeats])
        out.acks = [a for a in acks if a is not None]
        return out

    def _count_conflicts(self, replays: list[Ack | None]) -> None:
        """Count the repeats that are no replays (``id_conflict``) and say so, at most
        once a minute."""
        conflicts = [a for a in replays if a is not None and a.id_conflict]
        if not conflicts:
            return
        self.counters.id_conflicts += len(conflicts)
        now = time.monotonic()
        if now - self._conflict_warned >= CONFLICT_WARNING_INTERVAL_S:
            self._conflict_warned = now
            logger.warning(
                "%d request(s) reused the request_id of another request with a different "
                "prompt (first: %s; %d in all): each gets the first one's answer. The "
                "client's key columns are not unique", len(conflicts),
                conflicts[0].request_id, self.counters.id_conflicts)

    def _tokenized(self, requests: list[SidecarRequest], indices: list[int],
                   acks: list[Ack | None], out: Decisions) -> None:
        """Steps 4 (the tokenized prompt) and 5 for the requests at ``indices``."""
        encoded = self.engine.encode_prompt([requests[i].prompt for i in indices])
        max_len = getattr(self.engine, "max_model_len", 1 << 30)
        try:
            for i, ids in zip(indices, encoded):
                req = requests[i]
                req.prompt_token_ids = ids
                refusal = (check_prompt_tokens(req, self.config, max_model_len=max_len)
                           or self.load.check(req))
                acks[i] = self._refuse(req, refusal, out) if refusal else self._accept(req, out)
        finally:
            self.load.end_batch()

    def _refuse(self, req: SidecarRequest, refusal: Refusal, out: Decisions) -> Ack:
        if refusal.row:
            out.refused.append((req, refusal))
        else:
            self.counters.refused(refusal.reason)
        return self.seen.remember(Ack(req.request_id, False, refusal.reason, refusal.detail,
                                      received_ts=req.received_ts,
                                      fallback_text=self._fallback_text(req.priority)),
                                  req.priority, fingerprint=fingerprint(req))

    def _accept(self, req: SidecarRequest, out: Decisions) -> Ack:
        ack = self.seen.remember(Ack(req.request_id, True, None, "", False, req.received_ts),
                                 req.priority, fingerprint=fingerprint(req))
        out.accepted.append((req, self.load.admit(req)))
        return ack
