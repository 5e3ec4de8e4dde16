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
   (``results_backlog``);
4. *validate* the rest (:mod:`sidecar.admission.validate`): static checks, then, for
   the batch at once, the tokenized prompt (``rejected``);
5. *load* (:mod:`sidecar.admission.load`): pool full, watermarks, queue delay,
   deadline feasibility (``shed``);
6. *enqueue*: the request is handed to the scheduler's pool; the scheduler owns it
   from here (dispatch, deadlines, its one terminal row).

A refusal at steps 3-5 becomes the request's terminal row through the scheduler's
``shed`` (the one place a request becomes terminal), unless the channel had no room
even for that row; every decision is remembered for replays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.admission.dedupe import DedupeWindow
from sidecar.admission.gate import Gate
from sidecar.admission.load import LoadCheck
from sidecar.acks import Ack, Refusal
from sidecar.admission.validate import check_prompt_tokens, check_request_id, check_static
from sidecar.config import SchedulerConfig
from sidecar.contract import Priority, now_ms
from sidecar.request_state import SidecarRequest

if TYPE_CHECKING:
    from sidecar.engines import Engine
    from sidecar.load_control import LoadControl
    from sidecar.stats import SchedulerCounters


class Admission:
    """Admits or refuses requests for a scheduler.

    Args:
        config: The scheduler's limits.
        engine: Tokenizes prompts; names the served model.
        gate: Step 3, over the scheduler's state and its result channel.
        load: The scheduler's load model (step 5 reads it).
        counters: The scheduler's counters (submitted, duplicates, refusals).
        fallback_text: The fallback text of a priority's pool.
        shed: Ends a refused request with its terminal row (the scheduler's).
        enqueue: Hands an accepted request and its estimated queue wait (seconds) to
            the scheduler's pools.
    """

    def __init__(self, config: SchedulerConfig, *, engine: Engine, gate: Gate,
                 load: LoadControl, counters: SchedulerCounters,
                 fallback_text: Callable[[Priority | None], str],
                 shed: Callable[[SidecarRequest, Refusal], None],
                 enqueue: Callable[[SidecarRequest, float], None]) -> None:
        self.config = config
        self.engine = engine
        self.gate = gate
        self.load = LoadCheck(load)
        self.counters = counters
        self.seen = DedupeWindow(config.dedupe_window, fallback_text)
        self._fallback_text = fallback_text
        self._shed = shed
        self._enqueue = enqueue

    def submit_batch(self, requests: list[SidecarRequest]) -> list[Ack]:
        """Admit or refuse each request; one ack each, in order. Never waits."""
        now = now_ms()
        acks: list[Ack | None] = [None] * len(requests)
        to_encode: list[int] = []
        model_name = self.engine.model_name
        model_names = frozenset({model_name})  # the one model served
        batch_ids: set[str] = set()
        repeats: list[int] = []
        self.gate.open_batch()
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
                acks[i] = self._refuse(req, refusal)
                continue
            to_encode.append(i)
        if to_encode:
            self._tokenized(requests, to_encode, acks)
        # A replay repeats the first copy's decision (made above if it was in this batch).
        for i in repeats:
            acks[i] = self.seen.replay(requests[i].request_id, now)
        return [a for a in acks if a is not None]

    def _tokenized(self, requests: list[SidecarRequest], indices: list[int],
                   acks: list[Ack | None]) -> None:
        """Steps 4 (the tokenized prompt), 5 and 6 for the requests at ``indices``."""
        encoded = self.engine.encode_prompt([requests[i].prompt for i in indices])
        max_len = getattr(self.engine, "max_model_len", 1 << 30)
        for i, ids in zip(indices, encoded):
            req = requests[i]
            req.prompt_token_ids = ids
            refusal = (check_prompt_tokens(req, self.config, max_model_len=max_len)
                       or self.load.check(req))
            acks[i] = self._refuse(req, refusal) if refusal else self._accept(req)

    def _refuse(self, req: SidecarRequest, refusal: Refusal) -> Ack:
        if refusal.row:
            self._shed(req, refusal)  # sets req.fallback_text with the terminal row
            fallback = req.fallback_text
        else:
            self.counters.refused(refusal.reason)
            fallback = self._fallback_text(req.priority)
        return self.seen.remember(Ack(req.request_id, False, refusal.reason, refusal.detail,
                                      received_ts=req.received_ts, fallback_text=fallback),
                                  req.priority)

    def _accept(self, req: SidecarRequest) -> Ack:
        ack = self.seen.remember(Ack(req.request_id, True, None, "", False, req.received_ts),
                                 req.priority)
        self._enqueue(req, self.load.wait_s)
        return ack
