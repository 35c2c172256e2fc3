"""Shared core of the token-level policies: one step rule, with hooks for the order.

:class:`BatchPolicy` is iteration-level batching with a per-step token budget
(vLLM's ``max_num_batched_tokens``) and a cap on running sequences
(``max_num_seqs``). Each step:

1. running requests, in :meth:`~BatchPolicy.order_running` order, get the
   tokens they still need (the rest of a prompt, or one decode token), within
   the budget; with ``chunked_prefill`` a prompt that does not fit is split;
2. waiting requests are admitted from the head of ``ctx.waiting`` while the
   batch has room and budget is left (the queue's type sets the order: a
   policy installs a :class:`~orcasim.policies.queues.KeyedQueue` to serve by
   priority, deadline or length);
3. a preemptive policy, when the batch is full, preempts (by recompute) the
   running request :meth:`~BatchPolicy.victim` names, to make room for the head.

Without chunked prefill a prompt larger than the whole budget can never be
scheduled; it is rejected with reason ``prompt_too_long`` (vLLM does the same).
:class:`~orcasim.policies.keyed.KeyedPolicy` serves and runs requests by a key on top of it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from itertools import repeat
from typing import Any, ClassVar, Literal

import simpy
from pydantic import Field

from orcasim.backlog import Backlog
from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.backlog_admit import admit_from_backlog
from orcasim.policies.base import PolicyParams, TokenPolicy, slots_field
from orcasim.policies.decode_pool import DecodePool
from orcasim.policies.pooled import PooledPlans
from orcasim.policies.runs import TokenRuns
from orcasim.policies.token_mem_runs import MemoryRuns
from orcasim.request import Request, RequestState
from orcasim.sched.token_memory import TokenMemory

RUNNING = RequestState.RUNNING


class MemoryParams(PolicyParams):
    """Memory options of a token policy (used only with a ``memory`` section)."""

    preemption: Literal["recompute", "swap"] = Field(
        "recompute", description="how a victim gives its KV memory back (with a memory section)")
    watermark: float = Field(0.0, ge=0, lt=1, description="share of blocks kept free when "
                             "admitting while others run (paged memory)")


class TokenParams(MemoryParams):
    """Parameters every :class:`BatchPolicy` has."""

    max_batch: int = slots_field(32)
    token_budget: int = Field(2048, gt=0, description="tokens computed per step at most")
    chunked_prefill: bool = Field(True, description="split a prompt across steps to fit the budget")


class BatchPolicy(PooledPlans, TokenPolicy):
    """Mixed prefill/decode batching under a token budget; subclasses choose the order."""

    Params: ClassVar[type[ComponentParams]] = TokenParams
    models_kv_memory: ClassVar[bool] = True
    #: whether :meth:`victim` is consulted when the batch is full
    preemptive: bool = False
    #: off: :meth:`admit_waiting` takes its general steps on a lazy source's backlog too
    lean_backlog: ClassVar[bool] = True

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.chunked: bool = bool(getattr(params, "chunked_prefill", False))
        self._budget: int = getattr(params, "token_budget", 1 << 62)  # tokens per step at most
        self.mem: TokenMemory | None = None
        self._preempted_for_memory = False
        cls = type(self)  # runs need the plain step rule and effects (see TokenPolicy.decode_run)
        self._runs = (self.runs_unchanged and cls.next_step is BatchPolicy.next_step
                      and cls.complete_step is BatchPolicy.complete_step)
        if ctx is not None and ctx.kv.limited:
            p: Any = params
            self.mem = TokenMemory(ctx.kv, getattr(p, "preemption", "recompute"),
                                   getattr(p, "watermark", 0.0))
        #: make_plan's latest plan, how many of its requests are the pool, and its other entries
        self._pooled: tuple[StepPlan | None, int, list[tuple[Request, int]]] = (None, 0, [])
        self._left: tuple[StepPlan | None, int] = (None, 0)  # make_plan's steps_left
        #: schedule_running's list whose first entries decode: (list, entries, KV, steps left)
        self._decodes: tuple[list[tuple[Request, int]], int, int, int] | None = None
        #: whether running requests get tokens in admission order (then the pool's members,
        #: the running requests of the latest run, are the first ones)
        self._fifo = (cls.order is BatchPolicy.order
                      and cls.order_running is BatchPolicy.order_running)
        #: the running requests advanced together (with a memory limit: MemoryRuns.bind's)
        self.pool: DecodePool | None = (
            DecodePool() if self._runs and self.mem is None and self.pool_safe() else None)
        if not self._runs:  # step by step: spare the engine the ask
            self.decode_run = None  # type: ignore[assignment]
        elif self.mem is not None:  # runs whose memory is settled, where they apply
            MemoryRuns.bind(self)
        if self.mem is not None or cls.next_step is not BatchPolicy.next_step:
            self.ready_plan = None  # type: ignore[assignment]

    def pool_safe(self) -> bool:
        """Whether the step rule may see the running requests that decode together as they
        were when they joined the :class:`~orcasim.policies.decode_pool.DecodePool` (their
        counters are written when they leave it or are listed): true when they get tokens in
        admission order; a policy whose order or victim reads a running request's counters
        says so only if it reads them through the pool or a joined one reads the same."""
        return self._fifo

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        ctx = self.ctx
        mem = self.mem
        while True:
            ctx.poll_arrivals()
            if mem is not None:
                mem.blocked = False
            scheduled = self.schedule()
            if scheduled:
                return self.planned(self._plan(scheduled))
            if (not ctx.waiting and not self.running and ctx.arrivals_done
                    and not (mem is not None and mem.swapped)):
                return None
            yield ctx.wake_event()

    def continue_step(self) -> StepPlan | None:
        scheduled, _ = self.schedule_running(self.params.token_budget)
        return self._plan(scheduled) if scheduled else None

    def ready_plan(self) -> StepPlan | None:  # type: ignore[override]
        """:meth:`next_step` without a generator when a plan is ready (no memory limit: then
        a schedule that finds nothing to do changes nothing, and :meth:`next_step` repeats it)."""
        self.ctx.poll_arrivals()
        scheduled = self.schedule()
        return self.planned(self.make_plan(scheduled)) if scheduled else None

    def planned(self, plan: StepPlan) -> StepPlan:
        """Hook: the step rule planned ``plan``, which runs next (not called for the plans of
        :meth:`continue_step`)."""
        return plan

    def _plan(self, scheduled: list[tuple[Request, int]]) -> StepPlan:
        plan = self.make_plan(scheduled)
        if self.mem is not None:
            plan.swap_time = self.mem.take_swap_time()
        return plan

    # -- hooks ---------------------------------------------------------------
    def order_running(self) -> Iterable[Request]:
        """The order in which running requests get tokens (:meth:`order` of ``self.running``)."""
        return self.order(self.running)

    def order(self, reqs: list[Request]) -> Iterable[Request]:
        """The order in which running ``reqs`` (in admission order) get tokens (default: as is)."""
        return reqs

    def last_step_order(self, reqs: list[Request]) -> list[Request]:
        return list(self.order(TokenRuns.last_step_order(self, reqs)))

    def victim(self, head: Request) -> Request | None:
        """A running request to preempt so that ``head`` can run, or ``None``."""
        return None

    def decode_entries(self) -> list[tuple[Request, int]]:
        """A step's ``(request, 1)`` for every running request, in :meth:`order_running`
        order (every one of them decodes)."""
        return list(zip(self.order_running(), ONE, strict=False))

    def memory_victim(self) -> Request:
        """The running request to preempt when a running one lacks memory (the last admitted)."""
        return self.running[-1]

    def admitted(self, req: Request) -> None:
        """Hook: ``req`` was just admitted from the waiting queue."""

    # -- the step rule ---------------------------------------------------------
    def schedule(self) -> list[tuple[Request, int]]:
        """This step's ``(request, tokens)``: running requests first, then admissions.

        A step that preempted for memory admits nothing new (vLLM's rule).
        """
        self._preempted_for_memory = False
        scheduled, budget = self.schedule_running(self._budget)
        if not self._preempted_for_memory:
            self.admit_waiting(scheduled, budget)
        return scheduled

    def schedule_running(self, budget: int) -> tuple[list[tuple[Request, int]], int]:
        """The running requests' tokens this step, within ``budget``; the budget left."""
        chunk = self.chunked
        mem = self.mem
        held, bs = (mem.held, mem.kv.block_size) if mem is not None else (None, 0)
        decoding = self.decoding
        pool = self.pool
        if decoding is not None:  # right after a run: every running request decodes
            if decoding[0] is self.running and decoding[1] == len(self.running) <= budget and (
                    mem is None or mem.grow_after_run()):  # (the blocks they need, if free)
                if self._fifo and pool is not None:  # the pool's members, in that order
                    scheduled = pool.entries.copy()
                else:
                    scheduled = self.decode_entries()  # (sees decoding)
                self.decoding = None
                self._decodes = (scheduled, decoding[1], decoding[2], decoding[3])
                return scheduled, budget - decoding[1]
            self.decoding = None
        if pool is not None and pool.size and mem is not None:
            mem.settle()  # (the pool's members as the memory checks below read them)
        if pool is not None and pool.size and mem is None and self._fifo and pool.size <= budget:
            # in admission order the pool's members come first, and each decodes
            p = pool.size
            scheduled = pool.entries.copy()
            self._decodes = (scheduled, p, pool.kv, pool.first_finish())
            order: Iterable[Request] = self.running[p:]
            budget -= p
        else:
            scheduled = []
            order = self.order_running()
        for req in order if mem is None else list(order):
            if budget <= 0:
                break
            need = (req.prompt_len or 1) + req.num_output_tokens - req.num_computed_tokens
            if need > budget:  # (need: its num_tokens less those computed)
                if chunk:
                    need = budget
                elif scheduled:
                    continue
            if mem is not None:
                if req.state != RUNNING:
                    continue  # preempted for memory earlier in this round
                h = held.get(req.id) if held is not None else None
                if h is None or h * bs < req.num_computed_tokens + need:  # it needs a block
                    ok, budget = self._grow(req, need, scheduled, budget)
                    if not ok:
                        continue
            scheduled.append((req, need))
            budget -= need
        return scheduled, budget

    def _grow(self, req: Request, need: int, scheduled: list[tuple[Request, int]],
              budget: int) -> tuple[bool, int]:
        """Memory for ``need`` more tokens of running ``req``, preempting victims until it fits.

        Returns whether ``req`` still runs, and the budget (a victim already
        scheduled this step gives its tokens back).
        """
        kv = self.ctx.kv
        total = req.num_computed_tokens + need
        while not kv.try_allocate(req, total):
            victim = self.memory_victim()
            budget += unschedule(scheduled, victim)
            self.preempt(victim, "kv_full")
            self._preempted_for_memory = True
            if victim is req:
                return False, budget
        return True, budget

    def preempt(self, req: Request, reason: str = "priority") -> None:
        """Preempt running ``req``: swap its blocks out (``preemption: swap``) or recompute."""
        self.decoding = self._decodes = None  # the batch changes
        mem = self.mem
        if mem is not None and mem.swap and mem.swap_out(req):
            self.running.remove(req)
            self.ctx.preempted(req, reason)
            return
        super().preempt(req, reason)

    def admit_waiting(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        """Admit from the head of ``ctx.waiting`` into ``scheduled``; return the budget left.

        Swapped-out requests come back before the head of the queue when
        :meth:`swap_first` says so (by default always: first come, first served).
        """
        ctx = self.ctx
        waiting = ctx.waiting
        mem = self.mem
        preemptive = self.preemptive
        if type(waiting) is Backlog and mem is None and not preemptive and self.lean_backlog:
            return admit_from_backlog(self, waiting, scheduled, budget,  # (none from an empty
                                      type(self).admitted is not BatchPolicy.admitted)  # one)
        slots = ctx.slots
        swapped = mem.swapped if mem is not None else ()
        if not swapped and (budget <= 0 or (
                slots.count >= slots.capacity and not preemptive) or not waiting):
            return budget  # (what the loop below finds at once)
        running = self.running
        while budget > 0:
            if swapped and (not waiting or self.swap_first(swapped[0], waiting[0])):
                if slots.count >= slots.capacity or not self._swap_in(scheduled, budget):
                    break  # head-of-line: the swapped request waits for a slot or memory
                budget -= scheduled[-1][1]
                continue
            if slots.count >= slots.capacity and not preemptive:
                break  # (the batch is full: what the checks below find, without the queue)
            if not waiting:
                break
            if slots.count >= slots.capacity:
                victim = self.victim(waiting[0]) if preemptive else None
                if victim is None:
                    break
                budget += unschedule(scheduled, victim)
                self.preempt(victim, "priority")
                continue
            head = waiting[0]
            need = head.num_tokens - head.num_computed_tokens
            if need > budget:
                if self.chunked:
                    need = budget
                elif scheduled:
                    break  # head-of-line: it waits for a step with room
                elif head.num_output_tokens == 0 and need > self.params.token_budget:
                    waiting.popleft()
                    ctx.reject(head, "prompt_too_long")
                    continue
                # else: a preempted request's recompute runs alone, over the budget
            if mem is not None:
                if head.first_scheduled is None:
                    reason = mem.misfit(head)
                    if reason is not None:
                        waiting.popleft()
                        ctx.reject(head, reason)
                        continue
                if not mem.admit(head, head.num_computed_tokens + need, bool(running)):
                    victim = self.victim(head) if self.preemptive else None
                    if victim is None:
                        break  # head-of-line: it waits for memory
                    budget += unschedule(scheduled, victim)
                    self.preempt(victim, "priority")
                    continue
            waiting.popleft()
            ctx.admit(head)
            running.append(head)
            self.decoding = None  # the batch changed
            scheduled.append((head, need))
            budget -= need
            self.admitted(head)
        return budget

    def swap_first(self, swapped: Request, head: Request) -> bool:
        """Whether the first swapped-out request comes back before the queue's ``head``."""
        return True

    def _swap_in(self, scheduled: list[tuple[Request, int]], budget: int) -> bool:
        """Bring the first swapped-out request back if memory allows; False if it must wait."""
        mem = self.mem
        assert mem is not None
        req = mem.swapped[0]
        need = min(req.num_tokens - req.num_computed_tokens, budget)
        if not mem.swap_in(req, req.num_computed_tokens + need, bool(self.running)):
            return False
        self.ctx.admit(req)
        self.running.append(req)
        self.decoding = None
        scheduled.append((req, need))
        return True

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        pool = self.pool
        if pool is not None and pool.size and (self._pooled[0] is not plan or self._pooled[1]):
            pool.clear()  # the step changes its members one by one
        mem = self.mem
        if mem is not None:
            mem.kv.observe(t_start, t_end, plan.num_kv_tokens + plan.num_tokens, mem.blocked)
        super().complete_step(plan, t_start, t_end)

    def running_requests(self) -> Iterable[Request]:
        if self.pool is not None:
            self.pool.sync()
        mem = self.mem
        if mem is None or not mem.swapped:
            return iter(self.running)
        return iter([*self.running, *mem.swapped])

    def drop(self, req: Request) -> None:
        self.decoding = self._decodes = None  # the batch changes
        if self.pool is not None:
            self.pool.leave(req)
        mem = self.mem
        if mem is not None and req in mem.swapped:
            mem.swapped.remove(req)
            mem.kv.discard_swapped(req)
            return
        super().drop(req)


#: a decode's tokens, for every request of a zip
ONE = repeat(1)


def unschedule(scheduled: list[tuple[Request, int]], req: Request) -> int:
    """Remove ``req`` from ``scheduled``; return the tokens it had (0 if absent). Looks from
    the end: a victim (the last in its policy's order) is scheduled late, and only once."""
    for i in range(len(scheduled) - 1, -1, -1):
        r, n = scheduled[i]
        if r is req:
            del scheduled[i]
            return n
    return 0
