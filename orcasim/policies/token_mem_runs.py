"""Runs of unchanged decode steps for a token-level policy under a KV memory limit.

Without a memory section a :class:`~orcasim.policies.common.BatchPolicy`
offers runs through :meth:`~orcasim.policies.runs.TokenRuns.decode_run`. With
one, each boundary of a run would also grow the running requests' memory
(paged: a block whenever a request's tokens cross a block boundary), might
admit the head of the queue if its memory fits, and records the pool's state.
:class:`MemoryRuns` offers a run only while all of that is settled for its
whole length:

- every block the running requests take at the run's boundaries is free when
  the run starts (:meth:`MemoryRuns.covered`), so no step of the run could
  preempt for memory; the run ends before the first boundary that might;
- nobody is swapped out (a swap-in would be tried at every boundary);
- nobody waits, or the batch has no room (as without memory), or the head of
  the queue is refused memory (or not looked at) at every later boundary:
  so it is if it was the last request refused memory at the run's first
  boundary (memory only shrinks while nobody leaves, and the head asks for
  at least as many tokens later: the budget left by a step in which every
  running request decodes is the largest); a head that boundary did not try
  is tried as the next boundary would try it (:meth:`MemoryRuns.head_later`).
  Its steps record the free memory as stranded. With a first-come-first-served
  queue arrivals queue behind it; with another order an arrival ends the run.

At the run's end :meth:`MemoryRuns.complete_run` gives each running request
the blocks it takes at the run's boundaries, with the allocator's free count
and internal fragmentation as step-by-step simulation leaves them, records
each step's memory row, then applies the steps' token effects as without
memory (``tests/test_token_memory_runs.py`` compares the two ways).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from orcasim.backlog import Backlog
from orcasim.kv.allocators import PagedAllocator, ReservationAllocator
from orcasim.plan import StepPlan
from orcasim.policies.pooled import PooledPlans
from orcasim.policies.runs import TokenRuns
from orcasim.request import Request

#: a run shorter than this is stepped (a run of one step is a step)
MIN_RUN_STEPS = 2


class MemoryRuns:
    """``decode_run`` and ``complete_run`` of a token policy with a memory section."""

    #: off: no decode pool under memory (each run's end is a pass over the running requests)
    pooled = True

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        mem = self.mem = policy.mem
        self.kv = kv = mem.kv
        self.alloc = kv.alloc
        self.paged: bool = kv.paged
        self.bs: int = kv.block_size
        #: the step rule's tokens per step at most (see TokenRuns.decode_budget)
        self.budget: int = policy.decode_budget()
        #: whether :meth:`head_later` may decide: the plain step rule and admission, a paged
        #: pool (and, asked each time, no preemption for a waiting request)
        self.head_rule = False
        self.t0 = 0.0  # the start of the run's first step
        #: the plan decode_run offered a run after, and whether its later steps strand memory
        self.noted: tuple[StepPlan | None, bool] = (None, False)
        #: whether the running requests decode together in the policy's decode pool
        #: (:class:`~orcasim.policies.token_mem_pool.PooledMemoryRuns`)
        self.pooled_runs = False

    @staticmethod
    def bind(policy: Any) -> None:
        """Give ``policy`` (with a memory section and runs) memory-aware runs where they
        apply: the plain ``decode_run`` and ``complete_run``, a paged or reservation pool,
        no event-driven processes. Elsewhere it steps one event at a time."""
        kind = type(policy)
        if (kind.decode_run is TokenRuns.decode_run
                and kind.complete_run is PooledPlans.complete_run
                and kind.steps_left is PooledPlans.steps_left
                and not policy.event_driven
                and type(policy.mem.kv.alloc) in (PagedAllocator, ReservationAllocator)):
            from orcasim.policies.common import BatchPolicy
            from orcasim.policies.keyed import KeyedPolicy

            if (MemoryRuns.pooled and kind.schedule is BatchPolicy.schedule
                    and kind.schedule_running is BatchPolicy.schedule_running
                    and policy.pool_safe()):
                from orcasim.policies.token_mem_pool import PooledMemoryRuns

                runs: MemoryRuns = PooledMemoryRuns(policy)  # (with the policy's decode pool)
            else:
                runs = MemoryRuns(policy)
            runs.head_rule = (runs.paged and kind.schedule is BatchPolicy.schedule
                              and kind.schedule_running is BatchPolicy.schedule_running
                              and kind.has_room is TokenRuns.has_room
                              and kind.admit_waiting in (BatchPolicy.admit_waiting,
                                                         KeyedPolicy.admit_waiting))
            policy.decode_run = runs.decode_run
            policy.complete_run = runs.complete_run
        else:
            policy.decode_run = None

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """:meth:`~orcasim.policies.runs.TokenRuns.decode_run` under the memory limit (see
        the module doc)."""
        if plan is None:
            return None
        mem = self.mem
        #: with a decode pool a single step is a run of one (its end touches only what
        #: changed): what concerns only the later boundaries of a run then caps it at one step
        one = self.pooled_runs
        cap = 1 << 62
        if mem.swapped or self.kv.has_getters:
            if not one or self.kv.has_getters:
                return None
            cap = 1  # (a swap-in is tried at the next boundary)
        policy = self.policy
        running = policy.running
        size = len(running)
        if not size or plan.num_seqs != size:
            return None
        waiting = policy.ctx.waiting
        room = policy.has_room()
        stranded = False
        if waiting:
            if room:  # the head must be refused memory (or not tried) at every later boundary
                refused = mem.refused
                if mem.blocked and refused is not None and waiting[0] is refused:
                    stranded = True  # (the request refused memory last at this boundary)
                else:
                    later = self.head_later(plan, waiting)
                    if later is None:
                        if not one:
                            return None
                        cap = 1
                    stranded = bool(later)
                # behind it in a first-come-first-served queue, an arrival waits as well
                room = policy.preemptive or type(waiting) not in (Backlog, deque)
            elif policy.preemptive and plan.num_tokens >= self.budget:
                if not one:
                    return None  # (the plan spent the budget before looking at the queue)
                cap = 1
        least = 1 if one else MIN_RUN_STEPS
        left = policy.steps_left(plan)
        if left > cap:
            left = cap
        if left < least:
            return None
        if self.paged and left > 1:
            left = self.covered(plan, left)
            if left < least:
                return None
        self.t0 = policy.ctx.env._now
        self.noted = (plan, stranded)
        return (size, plan.num_kv_tokens + plan.num_tokens, left,
                room or (policy.preemptive and policy.arrival_may_preempt()))

    def head_later(self, plan: StepPlan, waiting: Any) -> bool | None:
        """At the boundaries after ``plan`` (every running request decoding, nobody joining
        or leaving), whether the queue's head is refused memory at each (True), tried at
        none (False), or might be admitted at the first (None: no run).

        Only for the plain step rule of a policy that does not preempt, in a paged pool:
        there each later boundary leaves the head the same budget (the running requests
        take one token each) and fewer free blocks, so the first decides for all.
        """
        policy = self.policy
        if not self.head_rule or policy.preemptive:  # (a policy sets it after binding)
            return None
        budget = policy._budget - plan.num_seqs
        if budget <= 0:
            return False  # (admit_waiting looks at nobody)
        head = waiting[0]
        need = head.num_tokens - head.num_computed_tokens
        if need > budget:
            if not policy.chunked:
                return False  # head-of-line: it waits for a step with room
            need = budget
        mem = self.mem
        alloc = self.alloc
        if (head.first_scheduled is None and mem.misfit(head) is not None) or (
                head.id in alloc.held):
            return None  # (it would be rejected)
        c = head.num_computed_tokens + need
        want = -(-(c if c > 0 else 1) // self.bs) + mem.keep_free  # (allocate_tokens)
        free = alloc.num_free_blocks
        if want > free:
            return True
        if want <= free - plan.num_seqs:
            return None
        return True if want > free - self.taken_first(plan) else None

    def taken_first(self, plan: StepPlan) -> int:
        """The blocks the running requests take at the first boundary after ``plan`` (every
        one of them scheduled in it, nobody joining or leaving)."""
        bs = self.bs
        held = self.alloc.held
        taken = 0
        for r, n in plan.scheduled or ():
            if held[r.id] * bs == r.num_computed_tokens + n:
                taken += 1
        return taken

    def covered(self, plan: StepPlan, left: int) -> int:
        """How many steps from ``plan`` on (``left`` at most) the free blocks carry: a run
        of that many steps takes its blocks at boundaries ``1`` to ``steps - 1``.

        A request that has computed ``c`` tokens after ``plan`` and holds ``h`` blocks
        takes one at boundary ``h * bs - c + 1`` and every ``bs`` boundaries after.
        """
        alloc = self.alloc
        free = alloc.num_free_blocks
        bs = self.bs
        last = left - 1  # the last boundary of the longest run
        if free >= plan.num_seqs * -(-last // bs):  # (a block per request and bs boundaries)
            return left
        held = alloc.held
        firsts = sorted(held[r.id] * bs - r.num_computed_tokens - n + 1
                        for r, n in plan.scheduled or ())
        due = [0] * bs  # requests growing at a boundary, by its phase
        i = 0
        m = len(firsts)
        taken = 0
        for j in range(1, last + 1):
            while i < m and firsts[i] <= j:
                due[firsts[i] % bs] += 1
                i += 1
            taken += due[j % bs]
            if taken > free:
                return j
        return left

    def complete_pooled(self, plan: StepPlan, ends: list[float]) -> None:
        """:meth:`complete_run` with a decode pool (a subclass's)."""
        raise NotImplementedError

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan``, then ``len(ends) - 1`` decode steps of the same batch, ending at ``ends``.

        :meth:`~orcasim.policies.runs.TokenRuns.complete_run`'s token effects, in the
        same pass each running request's blocks taken at the run's boundaries; then each
        step's memory row, and the last step's finishers leave. The requests that need a
        block at the next boundary are noted for it (:meth:`TokenMemory.grow_after_run`).
        With a decode pool, :meth:`complete_pooled` instead.
        """
        if self.pooled_runs:
            self.complete_pooled(plan, ends)
            return
        policy = self.policy
        kv = self.kv
        alloc = self.alloc
        mem = self.mem
        noted, stranded = self.noted
        if noted is not plan:  # (not offered after this plan: no later step strands memory)
            stranded = False
        ctx = policy.ctx
        k = len(ends)
        last = more = k - 1  # the run's boundaries; tokens each computes after the first step
        prev_end = ctx.last_step_end
        t1, t_end = ends[0], ends[-1]
        before_last = ends[-2] if k > 1 else prev_end
        record_itl = ctx.recorder.record_itl
        paged = self.paged
        bs = self.bs
        held = alloc.held if paged else {}
        final = alloc._internal if paged else {}
        grow = [0] * k  # blocks taken at each boundary
        tails = [0] * k  # internal slots that appear at each boundary
        needy = []  # the requests that take a block at the next boundary
        bulk = tokens = 0
        left = 1 << 62
        finished = []
        for req, n in plan.scheduled or ():
            c = req.num_computed_tokens + n  # after the first step
            if paged and held[req.id] * bs - c < last:
                take_run_blocks(req, c, held, final, bs, grow, tails)
            out = req.num_output_tokens
            if out == 0:
                req.first_token = t1
            elif req.last_token == prev_end:
                bulk += 1
            else:
                record_itl(t1 - req.last_token)  # type: ignore[operator]
            out += k
            rest = req.output_len - out
            if rest > 0:
                req.num_computed_tokens = c = c + more
                req.num_output_tokens = out
                req.last_token = t_end
                tokens += c
                if paged and held[req.id] * bs <= c:  # its next token needs a block
                    needy.append(req)
                if rest < left:
                    left = rest
            else:  # it finishes in the last step: leave it as that step finds it
                req.num_computed_tokens = c + more - 1
                req.num_output_tokens = out - 1
                req.last_token = before_last
                finished.append(req)
        plan.num_itl_tokens = bulk
        used = alloc.allocated_slots
        internal = alloc.internal_slots
        allocated_rows = [used]
        internal_rows = [internal]
        for s in range(1, k):
            used += grow[s] * bs
            internal += tails[s]
            allocated_rows.append(used)
            internal_rows.append(internal)
        first = plan.num_kv_tokens + plan.num_tokens
        size = plan.num_seqs
        blocked = mem.blocked
        if stranded == blocked:
            kv.observe_run(self.t0, ends, first, size, allocated_rows, internal_rows, blocked,
                           True)
        else:  # the first step's row as it was planned, then the later steps'
            kv.observe(self.t0, ends[0], first, blocked)
            if last:
                kv.observe_run(ends[0], ends[1:], first + size, size, allocated_rows[1:],
                               internal_rows[1:], stranded, True)
        if used > kv.peak_allocated:  # (as the boundaries' allocations note it)
            kv.peak_allocated = used
        if paged and last:
            alloc.num_free_blocks = alloc.layout.num_blocks - used // bs
            alloc.internal_slots = internal
        if finished:
            if k > 1 and len(finished) > 1:
                finished = policy.last_step_order(finished)
            policy.finish_run(finished, t_end)
        running = policy.running
        mem.needy = needy
        policy.decoding = (running, len(running), tokens, left)


def take_run_blocks(req: Request, c: int, held: dict[int, int], final: dict[int, int],
                    bs: int, grow: list[int], tails: list[int]) -> None:
    """The paged blocks ``req`` takes at the boundaries of a run of ``len(grow)`` steps,
    having computed ``c`` tokens after its first step: ``held`` and, at its final block,
    ``final`` (``PagedAllocator._note_final``) updated, each block counted in ``grow`` and
    the final block's internal slots in ``tails`` at its boundary (the caller has checked
    that it takes one at the run's last boundary at the latest)."""
    rid = req.id
    h = held[rid]
    s = 0
    for s in range(h * bs - c + 1, len(grow), bs):  # from its first boundary with a block
        grow[s] += 1
        h += 1
    held[rid] = h
    p = req.prompt_len
    tail = h * bs - ((p if p > 0 else 1) + req.output_len - 1)
    if tail >= 0:
        final[rid] = tail
        tails[s] += tail
