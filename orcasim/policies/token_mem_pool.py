"""Runs of a token policy under a KV memory limit, with its running requests in a decode pool.

:class:`~orcasim.policies.token_mem_runs.MemoryRuns` offers runs under a
memory section and applies each one in a pass over the running requests,
giving each the blocks it takes at the run's boundaries. :class:`PooledMemoryRuns`
offers the same runs for a policy on the plain step rule whose running
requests may decode together in a decode pool (``pool_safe``), as they do
without memory: a run's end advances the pool in one go
(:meth:`~orcasim.policies.pooled.PooledPlans.complete_run`), and the blocks
are taken by phase (:class:`~orcasim.policies.growing_pool.GrowingPool` in a
paged pool): only the members that take a block at a boundary, finish, join
or leave are touched. The requests of a run's first step that are not
members (newcomers, requests back from a preemption) take their blocks as in
the plain pass, then join the pool. The members' blocks are always up to
date; their token counters are written when something reads them, as without
memory. A boundary whose growth the free blocks do not cover writes the
counters of the members due and leaves their blocks to the step rule's own
pass (:meth:`~orcasim.policies.growing_pool.GrowingPool.grow_now`); any other
pass of the step rule over the running requests, and a step decided on its
own, empty the pool first. With the pool a step right after a run is a run of
one step wherever it cannot start a longer one (:meth:`MemoryRuns.decode_run`).
``tests/test_token_memory_runs.py`` compares runs with step-by-step
simulation with the pool and without it (``MemoryRuns.pooled = False``).
"""

from __future__ import annotations

from typing import Any

from orcasim.kv.allocators import PagedAllocator
from orcasim.plan import StepPlan
from orcasim.policies.decode_pool import DecodePool
from orcasim.policies.growing_pool import GrowingPool
from orcasim.policies.pooled import PooledPlans
from orcasim.policies.token_mem_runs import MemoryRuns, take_run_blocks


class PooledMemoryRuns(MemoryRuns):
    """:class:`MemoryRuns` with the running requests in a decode pool (see the module)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        alloc = self.alloc
        pool = GrowingPool(alloc) if type(alloc) is PagedAllocator else DecodePool()
        policy.pool = self.mem.pool = pool
        self.pooled_runs = True

    def _rest(self, plan: StepPlan) -> tuple[Any, list[Any]] | None:
        """The policy's pool if ``plan``'s first entries are all its members (else ``None``,
        ``plan``'s entries as they are), and ``plan``'s other entries."""
        policy = self.policy
        noted, m, rest = policy._pooled
        if noted is plan and m:
            return policy.pool, rest
        return None, plan.scheduled or []

    def taken_first(self, plan: StepPlan) -> int:
        pool, rest = self._rest(plan)
        bs = self.bs
        held = self.alloc.held
        taken = pool.due_at(pool.steps + 1) if pool is not None else 0
        for r, n in rest:
            if held[r.id] * bs == r.num_computed_tokens + n:
                taken += 1
        return taken

    def covered(self, plan: StepPlan, left: int) -> int:
        """:meth:`MemoryRuns.covered`, the pool's members counted by phase: at each boundary
        every member of that boundary's phase (an upper bound: one whose first round is
        still to come counts too), the other requests one by one."""
        alloc = self.alloc
        free = alloc.num_free_blocks
        bs = self.bs
        last = left - 1
        if free >= plan.num_seqs * -(-last // bs):
            return left
        pool, rest = self._rest(plan)
        held = alloc.held
        firsts = sorted(held[r.id] * bs - r.num_computed_tokens - n + 1 for r, n in rest)
        due = [0] * bs  # the other requests growing at a boundary, by its phase
        phases = pool.phases if pool is not None else None
        steps = pool.steps if pool is not None else 0
        i = 0
        m = len(firsts)
        taken = 0
        for j in range(1, last + 1):
            while i < m and firsts[i] <= j:
                due[firsts[i] % bs] += 1
                i += 1
            taken += due[j % bs]
            if phases is not None:
                taken += len(phases[(steps + j) % bs])
            if taken > free:
                return j
        return left

    def complete_pooled(self, plan: StepPlan, ends: list[float]) -> None:
        """:meth:`MemoryRuns.complete_run` with the pool: the blocks taken at the run's
        boundaries (the pool's members by phase, the other requests one by one), the
        memory rows, then the token effects of
        :meth:`~orcasim.policies.pooled.PooledPlans.complete_run`."""
        policy = self.policy
        pool, rest = self._rest(plan)
        if pool is None:
            policy.pool.clear()
        kv = self.kv
        alloc = self.alloc
        mem = self.mem
        noted, stranded = self.noted
        if noted is not plan:  # (not offered after this plan: no later step strands memory)
            stranded = False
        k = len(ends)
        last = k - 1  # the run's boundaries
        used = alloc.allocated_slots
        internal = alloc.internal_slots
        allocated_rows = [used]
        internal_rows = [internal]
        if self.paged and last:
            bs = self.bs
            held = alloc.held
            final = alloc._internal
            grow = [0] * k  # blocks taken at each boundary
            tails = [0] * k  # internal slots that appear at each boundary
            for req, n in rest:  # (as MemoryRuns.complete_run)
                c = req.num_computed_tokens + n  # after the first step
                if held[req.id] * bs - c < last:
                    take_run_blocks(req, c, held, final, bs, grow, tails)
            if pool is not None:
                pool.rounds(grow, tails)
            for s in range(1, k):
                used += grow[s] * bs
                internal += tails[s]
                allocated_rows.append(used)
                internal_rows.append(internal)
        elif last:
            allocated_rows *= k
            internal_rows *= k
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
        if self.paged and last:  # (after the first step's row, which observe reads from it)
            alloc.num_free_blocks = alloc.layout.num_blocks - used // self.bs
            alloc.internal_slots = internal
        PooledPlans.complete_run(policy, plan, ends)
