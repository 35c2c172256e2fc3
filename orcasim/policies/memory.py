"""Decode-only batching under a KV memory limit: admission, lazy block growth, preemption.

:class:`KVDecodePolicy` is a :class:`~orcasim.policies.base.DecodeOnlyPolicy`
that, when the scenario has a ``memory`` section (``ctx.kv``), admits a
request only if its memory fits, grows paged requests one block at a time
and preempts when a running request needs a block and none is free. Without
a memory section it is exactly the unlimited policy.

Each planning round, in this order:

1. **growth** (paged): members whose next step needs one more block get it.
   A heap holds the step at which each member needs its next block, so a
   round costs O(1) plus O(log B) per block taken, never batch x tokens. If
   no block is free, a victim (``victim``: the last admitted, or the lowest
   priority) is preempted, by ``recompute`` (free its blocks, put it back at
   the head of the queue; it recomputes prompt and generated tokens when it
   runs again) or ``swap`` (copy its blocks to the CPU swap space at PCIe
   bandwidth, adding that time to the step; it is swapped back in
   before new requests are admitted). Swapping falls back to recompute when the swap space is full.
2. **swap-in**, first come first served, while the memory fits;
3. **admission** (the subclass's :meth:`admit`, using :meth:`try_join`):
   ``kv_admission: head_of_line`` stops at the first request whose memory
   does not fit, ``skip`` tries the requests behind it.

A request that can never run is taken out: its prompt alone needs more than
the whole pool (rejected, ``exceeds_kv_capacity``), or prompt + output exceeds
``max_model_len`` (rejected, ``exceeds_max_model_len``). A preempted request
that no longer fits even in an empty pool would be preempted forever: the run
ends with a :class:`~orcasim.errors.SimulationError` saying so.

Admission lives in :mod:`orcasim.policies.kv_admit`, growth, preemption and
swap-in in :mod:`orcasim.policies.kv_preempt`, runs of unchanged steps in
:mod:`orcasim.policies.kv_runs`; for ``continuous`` in a paged pool the
engine takes run after run in :mod:`orcasim.policies.kv_loop`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any, ClassVar, Literal

import simpy
from pydantic import Field

from orcasim.context import SchedulerContext
from orcasim.errors import ScenarioError
from orcasim.kv.allocators import PagedAllocator
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.base import DecodeOnlyPolicy
from orcasim.policies.common import MemoryParams
from orcasim.policies.kv_admit import KVAdmission
from orcasim.policies.kv_preempt import KVPreemption
from orcasim.policies.kv_runs import KVDecodeRuns
from orcasim.policies.runs import DecodeRuns
from orcasim.request import Request
from orcasim.sched.decode_growth import DecodeGrowth


class KVPolicyParams(MemoryParams):
    """Memory options of a decode-only policy (used only with a ``memory`` section)."""

    kv_admission: Literal["head_of_line", "skip"] = Field(
        "head_of_line", description="when a request's memory does not fit: stop, or try the next")
    victim: Literal["last_admitted", "lowest_priority"] = Field(
        "last_admitted", description="which running request is preempted")


class KVDecodePolicy(KVAdmission, KVPreemption, KVDecodeRuns, DecodeOnlyPolicy):
    """A decode-only policy that respects ``ctx.kv`` when the scenario limits KV memory."""

    models_kv_memory: ClassVar[bool] = True

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        kv = ctx.kv if ctx.kv.limited else None
        self.kv = kv
        self.growth: DecodeGrowth | None = None
        self._swapped_in: list[Request] = []  # swapped back in for the next step
        if kv is None:  # unlimited memory: the plain decode-only steps, without a wrapper
            self.next_step = DecodeOnlyPolicy.next_step.__get__(self)  # type: ignore[method-assign]
            self.complete_step = DecodeOnlyPolicy.complete_step.__get__(self)  # type: ignore[method-assign]
            self.continue_step = DecodeOnlyPolicy.continue_step.__get__(self)  # type: ignore[method-assign]
            self.finished = DecodeOnlyPolicy.finished.__get__(self)  # type: ignore[method-assign]
            self.ready_plan = DecodeOnlyPolicy.ready_plan.__get__(self)  # type: ignore[method-assign]
            self.join = DecodeOnlyPolicy.join.__get__(self)  # type: ignore[method-assign]
            self.decode_run = DecodeRuns.decode_run.__get__(self)  # type: ignore[method-assign]
            self.complete_run = DecodeRuns.complete_run.__get__(self)  # type: ignore[method-assign]
            return
        p: Any = params
        self.head_of_line = p.kv_admission == "head_of_line"
        self.swap = p.preemption == "swap"
        self.victim_rule = p.victim
        if self.swap and not kv.can_swap:
            raise ScenarioError("policy.preemption", "swap needs a paged pool, swap_space_gb > 0 "
                                "and the KV bytes per token (memory.model or bytes_per_token)")
        self.keep_free = int(p.watermark * kv.capacity_units) if kv.paged else 0
        self._max_len = kv.layout.max_model_len
        if kv.paged:
            self.growth = DecodeGrowth(kv.alloc)
        self._swapped: deque[Request] = deque()
        self._blocked = False  # a request waited for memory this round
        kind = type(self)
        # head-of-line admission into a plain paged pool, counted in one loop (_admit_counted)
        self._counted = (self.counted_admission and kv.paged and self.head_of_line
                         and type(kv.alloc) is PagedAllocator and kind.join is KVDecodePolicy.join
                         and kind.try_join is KVDecodePolicy.try_join
                         and kind.room is KVDecodePolicy.room)
        # the last request refused for memory, and what says it is refused again without
        # asking the allocator: paged, (it, the blocks it needs, 0, 0): it fits once they
        # and the reserve are free; a reservation, (it, the releases, free units and reserve
        # it saw): until memory is released it cannot fit (admissions only shrink holes)
        self._miss: tuple[Request, int, int, int] | None = None

    # -- planning -------------------------------------------------------------
    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        if self.kv is None:
            return (yield from DecodeOnlyPolicy.next_step(self))
        ctx = self.ctx
        while True:
            plan = self.ready_plan()
            if plan is not None:
                return plan
            if not ctx.waiting and not self._swapped and ctx.arrivals_done:
                return None
            if self._blocked or self._listens:  # memory (kv.get) may come back; a process
                yield ctx.wake_event()  # may admit
            else:
                yield ctx.arrival

    def ready_plan(self) -> StepPlan | None:  # type: ignore[override]
        """:meth:`next_step` without the wait (the engine's fast path): the plan, or None."""
        if self.kv is None:
            return DecodeOnlyPolicy.ready_plan(self)
        ctx = self.ctx
        ctx.poll_arrivals()
        secs = self._prepare()
        slots = ctx.slots
        if ctx.waiting and not self._swapped and slots.count < slots.capacity:
            self.admit()
        batch = self.batch
        if not batch.size:
            return None
        # without prefill charging, _batch_plan's plan built here
        plan = self._batch_plan() if self.prefill else StepPlan(batch.size, batch.num_kv_tokens)
        plan.swap_time = secs
        return plan

    def _prepare(self) -> float:
        """Growth, then swap-in, for the next step; seconds of swapping to charge to it."""
        growth = self.growth
        secs = 0.0
        if growth is not None:
            due = growth.round(self.batch.num_steps)
            if due is not None:  # memory is short: member by member, preempting
                secs = self._grow_exact(due)
        if self._deferred:  # joined during the last step; after growth (see DecodeGrowth.join)
            self._take_deferred()
        self._blocked = False
        if self._swapped:
            secs += self._swap_in()
        return secs

    def continue_step(self) -> StepPlan | None:
        secs = self._prepare()
        if not self.batch.size:
            return None
        plan = self._batch_plan()
        plan.swap_time = secs
        return plan

    def _batch_plan(self) -> StepPlan:
        """As for every decode-only policy, but a request swapped back in computes no prompt."""
        batch = self.batch
        joined = self._joined
        if self.prefill and joined:
            swapped_in = self._swapped_in
            fresh = sum(r.prompt_len + r.num_output_tokens for r in joined
                        if not swapped_in or r not in swapped_in)
            return StepPlan(batch.size, batch.num_kv_tokens - fresh, fresh,
                            batch.size - len(joined))
        return StepPlan(batch.size, batch.num_kv_tokens)

    def room(self) -> int:
        """How many more requests the batch may take (its free batch slots)."""
        return self.ctx.slots.free

    def join(self, req: Request) -> None:
        DecodeOnlyPolicy.join(self, req)
        growth = self.growth
        if growth is not None and req._batch_seq >= 0:
            p = req.prompt_len
            growth.join(req, self.batch.num_steps, (p if p > 0 else 1) + req.num_output_tokens)

    def _take_deferred(self) -> None:
        deferred = self._deferred
        super()._take_deferred()
        growth = self.growth
        if growth is not None:
            step = self.batch.num_steps
            for req in deferred:
                growth.join(req, step, max(req.prompt_len, 1) + req.num_output_tokens)

    # -- step effects ---------------------------------------------------------
    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        kv = self.kv
        if kv is None:
            return DecodeOnlyPolicy.complete_step(self, plan, t_start, t_end)
        kv.observe(t_start, t_end, self.batch.num_kv_tokens, self._blocked)
        if self._swapped_in:
            self._swapped_in = []
        return DecodeOnlyPolicy.complete_step(self, plan, t_start, t_end)

    def finished(self, reqs: list[Request], t_end: float) -> None:
        """Free the finished requests' memory, then record them."""
        kv = self.kv
        assert kv is not None
        growth = self.growth
        finish = self.ctx.finish
        release = kv.release
        if growth is None:
            for req in reqs:
                release(req)
                finish(req, t_end)
            return
        leave = growth.leave
        for req in reqs:
            leave(req.id)
            release(req)
            finish(req, t_end)

    def drop(self, req: Request) -> None:
        """Take ``req`` out (before an abort) and free its KV memory, or its swap space."""
        kv = self.kv
        if kv is None:
            return DecodeOnlyPolicy.drop(self, req)
        if req in self._swapped:
            self._swapped.remove(req)
            kv.discard_swapped(req)
            return None
        if self.growth is not None:
            self.growth.leave(req.id)
        DecodeOnlyPolicy.drop(self, req)
        kv.release(req)
        return None

    def running_requests(self) -> Any:
        if self.kv is None or not self._swapped:
            return iter(self.batch)
        return iter([*self.batch, *self._swapped])
