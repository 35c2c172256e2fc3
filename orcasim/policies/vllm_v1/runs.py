"""Runs of all-decode steps of the vllm-v1 policy, advanced by the engine in one event.

After a step in which every running request decoded one token (synchronous
scheduling, no trace observer), the following schedule() calls would do the
same again as long as nobody finishes, nobody can be admitted (the batch is
at ``max_num_seqs`` or nobody waits; any arrival ends the run) and every
request that crosses a block boundary finds a free block (no preemption).
:meth:`VllmRuns.decode_run` says how many such steps follow;
:meth:`VllmRuns.complete_run` applies them at the run's end with only the
work that changes state: one block per boundary crossed and, with prefix
caching, the hashes and cache entries of the blocks that fill, in the order
the per-step scheduler would make them (step, then running-list order), so
block ids, the free queue and the prefix cache end up exactly as step by
step. ``tests/test_vllm_v1_runs.py`` compares both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orcasim.plan import StepPlan
from orcasim.policies.vllm_v1.state import KIND_RUNNING, StepOutput

if TYPE_CHECKING:
    from orcasim.context import SchedulerContext
    from orcasim.kv.cache_manager import KVCacheManager
    from orcasim.kv.pool import KVPool
    from orcasim.policies.vllm_v1.state import Seq, StepObserver
    from orcasim.request import Request


def _count_crossings(firsts: list[int], steps: int, block_size: int) -> int:
    """Blocks the run's follow-on steps ``1..steps`` take, each request crossing first at ``j``."""
    n = 0
    for j in firsts:
        if j <= steps:
            n += 1 + (steps - j) // block_size
    return n


class VllmRuns:
    """Decode runs of the vllm-v1 policy (mixed into ``VllmV1``)."""

    params: Any
    ctx: SchedulerContext
    kv: KVCacheManager
    pool: KVPool | None
    running: list[Request]
    seqs: dict[int, Seq]
    observer: StepObserver | None
    _runs: bool
    _current: StepOutput | None
    _update_at_end: bool
    _run_t0: float = 0.0
    complete_step: Any  # VllmV1.complete_step

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """After ``plan``, how many all-decode steps follow unchanged: ``(size, kv, steps, True)``.

        As :meth:`~orcasim.policies.runs.TokenRuns.decode_run`: ``size``
        requests each decode one token, reading ``kv`` KV tokens in the
        following step; nobody finishes before step ``steps`` (the planned one
        counts) and the free blocks cover every boundary crossed before it;
        every arrival ends the run. ``None``: step by step.
        """
        out = self._current
        if (not self._runs or plan is None or out is None or out.plan is not plan
                or self.observer is not None or out.preempted):
            return None
        p = self.params
        running = self.running
        size = len(running)
        if p.async_scheduling or plan.num_seqs != size:
            return None
        if self.ctx.waiting and size < p.max_num_seqs:
            return None  # the head of the queue waits for blocks that only a finish frees
        max_len = p.max_model_len
        bs = p.block_size
        left = max_len
        firsts = []
        for e in out.entries:
            if not e[4]:
                return None  # recomputing after a preemption: no token this step
            req = e[0]
            n = min(req.output_len - req.num_output_tokens, max_len - req.num_tokens)
            if n < left:
                left = n
            # follow-on step j computes token C + j - 1: a new block when it starts one
            firsts.append(1 + (-req.num_computed_tokens) % bs)
        free = self.kv.pool.free_queue.num_free_blocks
        if left > 1 and _count_crossings(firsts, left - 1, bs) > free:
            lo, hi = 0, left - 1  # the last follow-on step whose blocks all fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _count_crossings(firsts, mid, bs) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            left = lo + 1
        self._run_t0 = self.ctx.now
        return size, plan.num_kv_tokens + plan.num_tokens, left, True

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan``, then ``len(ends) - 1`` all-decode steps, as :meth:`complete_step` each.

        The first and the last step go through the per-step update (tokens,
        finishes, ITL samples); the steps between advance every request's
        counters in bulk, and the block work of every follow-on step is
        replayed in order: new blocks at boundaries, cache entries and hashes
        of filled blocks, and the memory series' row of each step.
        """
        ctx = self.ctx
        t0 = self._run_t0
        self.complete_step(plan, t0, ends[0])
        k = len(ends)
        if k == 1:
            return
        running = list(self.running)
        size = len(running)
        kv = self.kv
        bs = kv.block_size
        caching = kv.enable_caching
        # (step, stage, position, phase): at a step's schedule (stage 0), a request takes a
        # block (phase 0), then registers its filled blocks in the cache (phase 1); as the
        # step's output lands (stage 1), it hashes the block its new token fills
        events = []
        for pos, req in enumerate(running):
            c = req.num_computed_tokens  # step j computes token c + j - 1, knowing c + j
            j = 1 + (-c) % bs
            while j < k:
                events.append((j, 0, pos, 0))
                j += bs
            if caching:
                events.append((1, 0, pos, 1))  # the first schedule call catches up, as step by step
                j = bs - c % bs or bs  # known tokens c + j fill a block
                while j < k:
                    if j > 1:
                        events.append((j, 0, pos, 1))
                    j += bs
                j = bs - (c + 1) % bs or bs  # the step's token fills one: c + j + 1 known
                while j < k - 1:
                    events.append((j, 1, pos, 0))
                    j += bs
        events.sort()
        pool = self.pool
        series = pool is not None and pool.series is not None
        kv_tokens = plan.num_kv_tokens + plan.num_tokens  # read by follow-on step 1
        i, num_events = 0, len(events)
        for j in range(1, k):
            while i < num_events and events[i][0] == j and events[i][1] == 0:
                _, _, pos, phase = events[i]
                req = running[pos]
                if phase == 0:
                    if not kv.append_block(req):
                        raise AssertionError("a decode run ran out of blocks")
                else:
                    kv.cache_blocks(req, req.num_computed_tokens + j)
                i += 1
            if j == k - 1:
                break
            if series:
                pool.observe(ends[j - 1], ends[j], kv_tokens + size, False)  # type: ignore[union-attr]
            kv_tokens += size
            while i < num_events and events[i][0] == j:  # the hashes, as the step's output lands
                req = running[events[i][2]]
                req.num_output_tokens += j
                kv.update_hashes(req)
                req.num_output_tokens -= j
                i += 1
        # the steps between in bulk, then the last one as a step of its own
        more = k - 2
        t = ends[-2]
        entries = []
        seqs = self.seqs
        for req in running:
            c = req.num_computed_tokens + more
            req.num_computed_tokens = c + 1
            req.num_output_tokens += more
            req.last_token = t
            seqs[req.id].num_in_flight += 1
            entries.append([req, 1, c, KIND_RUNNING, True])
        last = StepOutput(entries, [], [])
        last.plan = StepPlan(size, kv_tokens, 0, size)
        self._current = last
        self._update_at_end = True
        ctx.last_step_end = t
        self.complete_step(last.plan, t, ends[-1])
