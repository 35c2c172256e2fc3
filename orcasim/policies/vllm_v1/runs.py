"""Runs of all-decode steps of the vllm-v1 policy, advanced by the engine in one event.

After a step in which every running request samples a token (synchronous
scheduling, no trace observer; the step may complete prefills), every
following schedule() call gives each running request one decode token, as
long as nobody finishes, nobody can be admitted (the batch is at
``max_num_seqs`` or nobody waits; any arrival ends the run) and every
request that crosses a block boundary finds a free block (no preemption).
:meth:`VllmRuns.decode_run` says how many such steps follow;
:meth:`VllmRuns.complete_run` applies them at the run's end with only the
work that changes state: one block per boundary crossed and, with prefix
caching, the hashes and cache entries of the blocks that fill, each kind in
the order the per-step scheduler would make them (step, then running-list
order), so block ids, the free queue and the prefix cache end up exactly as
step by step. ``tests/test_vllm_v1_runs.py`` compares both.
"""

from __future__ import annotations

from operator import attrgetter, sub
from typing import TYPE_CHECKING, Any

from orcasim.plan import StepPlan
from orcasim.policies.vllm_v1.chain import ChainedRuns
from orcasim.policies.vllm_v1.state import StepOutput

if TYPE_CHECKING:
    from orcasim.request import Request


_computed = attrgetter("num_computed_tokens")
_output_len = attrgetter("output_len")
_num_output = attrgetter("num_output_tokens")


def _count_crossings(firsts: list[int], steps: int, block_size: int) -> int:
    """Blocks the run's follow-on steps ``1..steps`` take, each request crossing first at ``j``."""
    n = 0
    for j in firsts:
        if j <= steps:
            n += 1 + (steps - j) // block_size
    return n


class VllmRuns(ChainedRuns):
    """Decode runs of the vllm-v1 policy (mixed into ``VllmV1``)."""

    _runs: bool
    _current: StepOutput | None
    _update_at_end: bool
    _run_t0: float = 0.0
    complete_step: Any  # VllmV1.complete_step
    _lazy: bool
    _limits: tuple[Any, ...]  # Scheduling._limits
    _group: Any  # DecodeGroup
    _steady: Any  # LazyDecode._steady
    _complete_group_run: Any  # LazyDecode._complete_group_run
    _retire: Any  # Output._retire
    #: decode_run's runs after the run's finishes: (the run's steps, [(size, kv, steps)])
    _chain: tuple[int, list[tuple[int, int, int]]] | None = None

    def decode_run(self, plan: StepPlan | None = None) -> tuple[Any, ...] | None:
        """After ``plan``, how many all-decode steps follow unchanged: ``(size, kv, steps, True)``.

        As :meth:`~orcasim.policies.runs.TokenRuns.decode_run`: ``size``
        requests each decode one token, reading ``kv`` KV tokens in the
        following step; nobody finishes before step ``steps`` (the planned one
        counts) and the free blocks cover every boundary crossed before it;
        every arrival ends the run. ``None``: step by step. When the run ends
        at finishes and nobody waits, a fifth item gives the runs that follow
        (:meth:`_chain_after`), which the engine may take in the same event.
        """
        out = self._current
        if (plan is None or out is None or out.plan is not plan or not self._runs
                or out.preempted):  # (no runs with an observer)
            return None
        running = self.running
        size = len(running)
        limits = self._limits
        if limits[3] or not size or plan.num_seqs != size:  # limits[3]: async scheduling
            return None
        if out.num_emits != size:
            return None  # someone is still prefilling or recomputing
        if size < limits[4] and self.ctx.waiting:  # limits[4]: max_num_seqs
            return None  # the head of the queue waits for blocks that only a finish frees
        bs = self.kv.block_size
        max_len = limits[1] + 1
        g = self._group
        n = out.num_group  # the decode group's members lead the running list
        listed = running[n:] if n else running
        if listed:
            if self._lazy and not self._steady(listed):
                return None  # they could not join the group after the step
            # computed = known tokens: all sample
            if len(listed) == 1:
                r = listed[0]
                left = r.output_len - r.num_output_tokens  # (min of two, written out)
                room = max_len - r.num_computed_tokens
                if room < left:
                    left = room
            else:
                left = min(min(map(sub, map(_output_len, listed), map(_num_output, listed))),
                           max_len - max(map(_computed, listed)))
            if n:  # a member samples its last token when the count reaches its last
                first = g.heap[0][0] - g.count + 1
                if first < left:
                    left = first
        else:
            left = g.heap[0][0] - g.count + 1
        free = self.kv.pool.free_queue.num_free_blocks
        by_finish = left
        if left > 1 and size * (1 + (left - 2) // bs) > free:  # the blocks may not last
            # follow-on step j computes token C + j - 1: a new block when it starts one
            firsts = [1 + (-c) % bs for c in map(_computed, listed)]
            for i, bucket in enumerate(g.buckets if n else ()):  # C = base + count
                firsts.extend([1 + (-(i + g.count)) % bs] * len(bucket))
            if _count_crossings(firsts, left - 1, bs) > free:
                lo, hi = 0, left - 1  # the last follow-on step whose blocks all fit
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _count_crossings(firsts, mid, bs) <= free:
                        lo = mid
                    else:
                        hi = mid - 1
                left = lo + 1
        self._run_t0 = self.ctx.env._now
        self._chain = None
        if left == by_finish and self._lazy and self.chain_runs and self._chainable():
            chain: list[tuple[int, int, int]] = []  # the runs the engine took from the generator
            self._chain = (left, chain)
            return (size, plan.num_kv_tokens + plan.num_tokens, left, True,
                    self._chain_after(listed, left, free, bs, max_len, chain))
        return size, plan.num_kv_tokens + plan.num_tokens, left, True

    def _run_output(self, plan: StepPlan, ends: list[float]) -> tuple[StepOutput, float, float]:
        """The output of the run's first step, taken here rather than at its end: ``(output,
        first step's end, the previous step's end)``."""
        out = self._current
        assert out is not None and out.plan is plan and self._update_at_end
        self._update_at_end = False
        t1, prev_end = ends[0], self.ctx.last_step_end
        out.t_end, out.prev_end = t1, prev_end
        return out, t1, prev_end

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan``, then ``len(ends) - 1`` all-decode steps, as :meth:`complete_step` each.

        The first step's output is applied as the per-step update would (every
        request samples, nobody finishes); the follow-on steps advance every
        request's counters in bulk (their inter-token gaps are the recorder's,
        one per request and step). Their work on blocks is replayed kind by
        kind, each kind in the per-step order (step, then running-list
        order): new blocks at boundaries (the schedule calls), hashes of
        blocks filled by a step's token (its output), cache entries of filled
        blocks (the schedule calls), then the memory rows and the last step's
        finishes. The kinds touch different state: a block taken from the
        free queue may drop a cache entry, but of a free block, never of one
        a request holds, and a cache entry needs only hashes of earlier steps.
        """
        k = len(ends)
        chain, self._chain = self._chain, None
        if chain is not None and k > chain[0]:
            self._complete_chain(plan, ends, chain[0], chain[1])
            return
        if k == 1:
            self.complete_step(plan, self._run_t0, ends[0])
            return
        if self._lazy:
            self._complete_group_run(plan, ends)
            return
        # the first step as complete_step does it: its memory row, then its output (every
        # request samples, nobody finishes), folded into the pass over the requests
        ctx = self.ctx
        _, t1, prev_end = self._run_output(plan, ends)
        pool = self.pool
        if pool is not None:
            pool.observe(self._run_t0, t1, plan.num_kv_tokens + plan.num_tokens, False)
        record_itl = ctx.recorder.record_itl
        bulk = 0
        last = k - 1  # the follow-on steps are 1..last; nobody finishes before the last
        running = self.running  # the scheduled requests, in the same order
        size = len(running)
        kv = self.kv
        bs = kv.block_size
        caching = kv.enable_caching
        max_len = self.params.max_model_len
        t = ends[-1]
        # follow-on step j computes token c + j - 1 (c: computed tokens after the first step),
        # knowing c + j tokens, o + j of them generated, after it
        appends: list[tuple[int, int]] = []  # (step, position): a block taken at its schedule
        fills: list[tuple[int, int, int]] = []  # (step, position, o): its token fills a block
        caches: list[tuple[int, int, int]] = []  # (step, position, tokens): cache_blocks
        finishing: list[Request] = []
        for pos, req in enumerate(running):  # the entries' requests, in their order
            o = req.num_output_tokens
            if o == 0:
                req.first_token = t1
            elif req.last_token == prev_end:
                bulk += 1
            else:
                record_itl(t1 - req.last_token)
            o += 1
            c = req.num_computed_tokens  # = known tokens before the step's token
            if caching and (c + 1) % bs == 0:  # its token fills a block
                req.num_output_tokens = o
                kv.update_hashes(req)
            j = 1 + (-c) % bs  # the first follow-on step that starts a block
            while j <= last:
                appends.append((j, pos))
                j += bs
            if caching:
                caches.append((1, pos, c + 1))  # the first call catches up, as step by step
                j = bs - c % bs or bs
                while j <= last:
                    if j > 1:
                        caches.append((j, pos, c + j))
                    j += bs
                j = bs - (c + 1) % bs or bs
                while j <= last:
                    fills.append((j, pos, o))
                    j += bs
            if o + last >= req.output_len or c + 1 + last >= max_len:
                finishing.append(req)
            req.num_computed_tokens = c + last
            req.num_output_tokens = o + last
            req.last_token = t
        plan.num_itl_tokens = bulk
        # new blocks, and the slots allocated in each follow-on step (its memory row)
        allocs: list[int] | None = None
        alloc = prev = 0
        if pool is not None and pool.series is not None:
            alloc = pool.alloc.allocated_slots
            allocs = []
            prev = 1  # the first follow-on step whose row is not in allocs
        if appends:
            appends.sort()
            if not kv.append_blocks([running[pos] for _, pos in appends]):
                raise AssertionError("a decode run ran out of blocks")
            if allocs is not None:
                for j, _ in appends:
                    if j > prev:
                        allocs.extend([alloc] * (j - prev))
                        prev = j
                    alloc += bs
        if caching:
            fills.sort()
            update_hashes = kv.update_hashes
            for j, pos, o in fills:
                req = running[pos]
                req.num_output_tokens = o + j
                update_hashes(req)
                req.num_output_tokens = o + last
            caches.sort()
            cache_blocks = kv.cache_blocks
            for _, pos, m in caches:
                cache_blocks(running[pos], m)
        if allocs is not None:  # the rows of the follow-on steps, before finishes free blocks
            assert pool is not None
            allocs.extend([alloc] * (last + 1 - prev))
            # step j (from ends[j - 1] to ends[j]) reads base + size * j KV tokens
            pool.observe_run(t1, ends[1:], plan.num_kv_tokens + plan.num_tokens + size, size,
                             allocs, [pool.alloc.internal_slots] * last, False)
        if finishing:
            retire = self._retire
            for req in finishing:
                retire(req)
            gone = {r.id for r in finishing}
            self.running = [r for r in running if r.id not in gone]
            self._finished_since_schedule = True
            finish = ctx.finish
            for req in finishing:
                finish(req, t)
