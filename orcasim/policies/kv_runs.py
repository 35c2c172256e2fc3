"""Runs of unchanged decode steps under a KV memory limit (mixed into ``KVDecodePolicy``).

With a ``memory`` section a decode batch still runs unchanged between
finishes, but each step boundary also grows paged members by a block (a
*round* of :class:`~orcasim.sched.decode_growth.DecodeGrowth`), may try to
swap a request back in or admit the head of the queue, and records the
pool's state. A run is offered only while all of that is settled for its
whole length:

- every round in the run is covered by the free blocks
  (:meth:`~orcasim.sched.decode_growth.DecodeGrowth.covered`), so the run
  ends before the first step that could preempt, and that step is decided
  one at a time;
- a request refused memory at the run's first boundary is refused at every
  later one (memory only shrinks while nobody leaves), so the batch cannot
  change and arrivals behind it cannot join; otherwise nobody was tried and
  nobody will be, or, with room, the run ends at the next arrival as without
  memory.

At the run's end :meth:`KVDecodeRuns.complete_run` replays each boundary's
round and records each step's memory state, then applies the batch's steps
as :meth:`~orcasim.policies.runs.DecodeRuns.complete_run` does: the same
effects, in the same order, as step-by-step simulation
(``tests/test_batch_runs.py`` compares the two).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar

from orcasim.errors import SimulationError
from orcasim.plan import StepPlan
from orcasim.policies.runs import DecodeRuns

if TYPE_CHECKING:
    from orcasim.batch import DecodeBatch
    from orcasim.request import Request
    from orcasim.sched.decode_growth import DecodeGrowth


class KVDecodeRuns(DecodeRuns):
    """``decode_run`` and ``complete_run`` of a decode-only policy with a memory limit."""

    kv: Any
    ctx: Any
    batch: DecodeBatch
    growth: DecodeGrowth | None
    head_of_line: bool
    _blocked: bool
    _swapped: deque[Request]
    _swapped_in: list[Request]

    #: whether :meth:`admit` tries the waiting queue at every boundary with a free slot
    #: (then a refusal repeats at every boundary of a run); ``static`` admits only into
    #: an empty batch
    admits_every_step: ClassVar[bool] = False
    _run_t0: float = 0.0
    #: shorter runs cost more than stepping (measured with benchmarks/bench_policies.py)
    min_run_steps: ClassVar[int] = 3

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """After the step just planned, how long the batch runs unchanged (see the module doc)."""
        kv = self.kv
        if kv is None:
            return DecodeRuns.decode_run(self, plan)
        batch = self.batch
        batch.drop_removed()  # a preempted member's entry would end the run early
        limit = batch.first_finish()
        if limit < self.min_run_steps:
            return None
        growth = self.growth
        if growth is not None:  # most often under a tight pool: the next round is not covered
            limit = growth.covered(batch.num_steps, limit - 1) + 1
            if limit < self.min_run_steps:
                return None
        if not self._runs or self._listens or self._deferred or kv.has_getters:
            return None
        ctx = self.ctx
        free_slots = ctx.slots.free > 0
        if self._blocked:  # a swap-in or the queue's head was refused memory at this boundary
            if not free_slots:
                return None
            if not self._swapped and not (self.head_of_line and self.admits_every_step):
                return None  # skip tries others, and a policy may stop trying
            room = False  # the refused request goes first; arrivals queue behind it
        else:
            if free_slots and (self._swapped or (ctx.waiting and self.admits_every_step)):
                return None  # not tried at this boundary (a deferred decision): step by step
            room = self.has_room()
        self._run_t0 = ctx.now
        size = batch.size
        return size, batch.num_kv_tokens + size, limit, room

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan`` and ``len(ends) - 1`` more steps: each boundary's round, each step's memory
        state, then the batch's steps as without memory."""
        kv = self.kv
        if kv is None:
            return DecodeRuns.complete_run(self, plan, ends)
        batch = self.batch
        alloc = kv.alloc
        more = len(ends) - 1
        growth = self.growth
        if growth is None:  # reservations: nothing changes until someone leaves
            allocated = [alloc.allocated_slots] * (more + 1)
            internal = [alloc.internal_slots] * (more + 1)
        else:
            try:
                allocated, internal = growth.run_rounds(batch.num_steps, more)
            except ValueError as err:
                raise SimulationError(f"a run of decode steps: {err}") from None
        # the same refusal (or none) at every boundary of the run
        kv.observe_run(self._run_t0, ends, batch.num_kv_tokens, batch.size, allocated, internal,
                       self._blocked, True)
        if self._swapped_in:
            self._swapped_in = []
        return DecodeRuns.complete_run(self, plan, ends)
