"""Which queued request starts next when the engine has a free slot.

A slot that a preemption freed goes to the pool that preempted for it; otherwise the
pools whose head can start (its pool's limits and the batch limit allow it) take turns
by :class:`~sidecar.pools.WeightedPicker`, FIFO within a pool.
"""

from __future__ import annotations

from sidecar.contract import Priority
from sidecar.load_control import LoadControl
from sidecar.pools import Pool, WeightedPicker
from sidecar.request_state import SidecarRequest


class DispatchOrder:
    """The dispatcher's choice between pools.

    Args:
        pools: The scheduler's pools (read).
        load: The load model (the batch limit of each priority).
    """

    def __init__(self, pools: dict[Priority, Pool], load: LoadControl) -> None:
        self.pools = pools
        self.load = load
        self.picker = WeightedPicker({p: pool.config.weight for p, pool in pools.items()})
        self.owed: dict[Priority, int] = dict.fromkeys(Priority, 0)
        """Slots freed by preemption on behalf of each pool, not yet taken by it."""
        self.sole_pool: Pool | None = None
        """Set by :meth:`next_request`: the pool of its pick when no other could start."""

    def next_request(self, in_flight: int) -> SidecarRequest | None:
        """The next request to start with ``in_flight`` sequences in the engine, or
        ``None`` when no pool has work and room; :attr:`sole_pool` is set to its pool
        when no other pool could start one."""
        self.sole_pool = None
        candidates: list[Priority] = []
        heads: list[SidecarRequest] = []
        for priority, pool in self.pools.items():
            head = pool.head()
            if head is None:
                self.picker.forget(priority)
                self.owed[priority] = 0
            elif pool.has_room_for(head) and in_flight < self.load.batch_limit(priority):
                candidates.append(priority)
                heads.append(head)
        if not candidates:
            return None
        for i, p in enumerate(candidates):
            if self.owed[p] > 0:  # a slot freed by preemption goes to the pool that preempted
                self.owed[p] -= 1
                return heads[i]
        if len(candidates) == 1:  # a pick among one leaves the picker's credits unchanged
            self.sole_pool = self.pools[candidates[0]]
            return heads[0]
        return heads[candidates.index(self.picker.pick(candidates))]
