"""``SlotPool``: the engine's batch slots (``max_num_seqs``) as a SimPy resource.

Every running request holds one slot. The context takes a slot when a policy
admits a request (:meth:`~orcasim.context.SchedulerContext.admit`) and gives it
back when the request finishes, is aborted or is preempted, so the count is
kept in one place whatever the policy. A policy reads :attr:`SlotPool.free`
at a step boundary (the step-synchronous style), or waits for a slot from a
process (the event-driven style):

- ``yield ctx.slots.freed`` resumes the next time a slot is given back;
- ``yield ctx.slots.request()`` resumes once a slot is reserved for the
  caller (first come, first served; by ``priority`` when given, smaller
  first); the next :meth:`admit` binds the reserved slot to a request;
- ``ctx.slots.request(priority=p, preempt=True)``, like
  :class:`simpy.PreemptiveResource`: when every slot is taken, the policy's
  preemption hook is asked to preempt a running request of a lower priority
  (larger value), which is told why (reason ``priority``) and requeued.

A slot request costs an event only when the caller waits; admissions at a
step boundary cost an integer increment.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy

from orcasim.errors import SimulationError
from orcasim.request import Request

#: capacity of a pool whose policy has no batch limit
UNLIMITED_SLOTS = 1 << 62


class SlotRequest(simpy.Event):
    """A request for one slot; succeeds (value: the pool) once a slot is reserved for it."""

    def __init__(self, pool: SlotPool, priority: float, preempt: bool) -> None:
        super().__init__(pool.env)
        self.pool = pool
        self.priority = priority
        self.preempt = preempt
        pool._seq += 1
        heapq.heappush(pool._getters, (priority, pool._seq, self))
        pool._serve()
        if preempt and not self.triggered and pool.preempt_hook is not None:
            pool.preempt_hook(priority)

    def cancel(self) -> None:
        """Withdraw the request; a slot already reserved for it is given back."""
        pool = self.pool
        if self.triggered:
            pool.reserved -= 1
            pool.release()
        else:
            pool._getters = [g for g in pool._getters if g[2] is not self]
            heapq.heapify(pool._getters)


class SlotPool:
    """``capacity`` batch slots; ``count`` are held by running requests or reserved."""

    def __init__(self, env: simpy.Environment, capacity: int | None) -> None:
        self.env = env
        self.limited = capacity is not None
        self.capacity = UNLIMITED_SLOTS if capacity is None else capacity
        self.count = 0
        #: slots reserved by granted :class:`SlotRequest` events, not yet bound to a request
        self.reserved = 0
        #: ``(priority) -> None``: asked to preempt a running request of a lower priority
        self.preempt_hook: Callable[[float], None] | None = None
        self._getters: list[tuple[float, int, SlotRequest]] = []
        self._seq = 0
        self._freed: simpy.Event | None = None

    @property
    def free(self) -> int:
        """Slots neither held nor reserved."""
        return self.capacity - self.count

    @property
    def freed(self) -> simpy.Event:
        """An event that fires the next time a slot is given back (a fresh one after each)."""
        ev = self._freed
        if ev is None:
            ev = self._freed = self.env.event()
        return ev

    def request(self, priority: float = 0, preempt: bool = False) -> SlotRequest:
        """An event that reserves a slot for the caller as soon as one is free."""
        return SlotRequest(self, priority, preempt)

    def admit(self, req: Request) -> None:
        """Bind a slot to an admitted request: a reserved one, or a free one."""
        if self.reserved:
            self.reserved -= 1
        elif self.count < self.capacity:
            self.count += 1
        else:
            raise SimulationError(f"request {req.label} was admitted with all "
                                  f"{self.capacity} batch slots taken")

    def release(self) -> None:
        """A running request gave its slot back: serve a waiting request, then fire ``freed``."""
        self.count -= 1
        if self._getters or self._freed is not None:  # someone waits: serve, fire freed
            self.released()

    def released(self) -> None:
        """After ``count`` went down: serve a waiting slot request, then fire ``freed``."""
        if self._getters:
            self._serve()
        ev = self._freed
        if ev is not None:
            self._freed = None
            ev.succeed(self)

    def _serve(self) -> None:
        getters = self._getters
        while getters and self.count < self.capacity:
            _, _, g = heapq.heappop(getters)
            self.count += 1
            self.reserved += 1
            g.succeed(self)
