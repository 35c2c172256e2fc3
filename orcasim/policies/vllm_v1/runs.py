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
caching, the hashes and cache entries of the blocks that fill, in the order
the per-step scheduler would make them (step, then running-list order), so
block ids, the free queue and the prefix cache end up exactly as step by
step. ``tests/test_vllm_v1_runs.py`` compares both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orcasim.plan import StepPlan
from orcasim.policies.vllm_v1.state import StepOutput

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
    _finished_since_schedule: bool
    complete_step: Any  # VllmV1.complete_step
    _retire: Any  # Scheduling._retire

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
        if p.async_scheduling or not size or plan.num_seqs != size:
            return None
        if self.ctx.waiting and size < p.max_num_seqs:
            return None  # the head of the queue waits for blocks that only a finish frees
        if out.num_emits != size:
            return None  # someone is still prefilling or recomputing
        bs = p.block_size
        computed = [r.num_computed_tokens for r in running]  # = known tokens: all sample
        left = min(min([r.output_len - r.num_output_tokens for r in running]),
                   p.max_model_len - max(computed))
        free = self.kv.pool.free_queue.num_free_blocks
        if left > 1 and size * (1 + (left - 2) // bs) > free:  # the blocks may not last
            # follow-on step j computes token C + j - 1: a new block when it starts one
            firsts = [1 + (-c) % bs for c in computed]
            if _count_crossings(firsts, left - 1, bs) > free:
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

        The first step's output is applied as the per-step update would (every
        request samples, nobody finishes); the follow-on steps advance every
        request's counters in bulk (their inter-token gaps are the recorder's,
        one per request and step), and their work on blocks and requests is
        replayed in order: per step, new blocks at boundaries and cache
        entries of filled blocks (the schedule call), the memory series' row
        (the step), then hashes of blocks filled by the step's token and, in
        the last step, finishes (its output).
        """
        k = len(ends)
        if k == 1:
            self.complete_step(plan, self._run_t0, ends[0])
            return
        # the first step as complete_step does it: its memory row, then its output (every
        # request samples, nobody finishes), folded into the pass that builds the events
        ctx = self.ctx
        out = self._current
        assert out is not None and out.plan is plan and self._update_at_end
        self._update_at_end = False
        t1, prev_end = ends[0], ctx.last_step_end
        out.t_end, out.prev_end = t1, prev_end
        pool = self.pool
        if pool is not None:
            pool.observe(self._run_t0, t1, plan.num_kv_tokens + plan.num_tokens, False)
        record_itl = ctx.recorder.record_itl
        bulk = 0
        last = k - 1  # the follow-on steps are 1..last; nobody finishes before the last
        running = self.running  # the scheduled requests, in the same order
        size = len(running)
        seqs = self.seqs
        kv = self.kv
        bs = kv.block_size
        caching = kv.enable_caching
        max_len = self.params.max_model_len
        t = ends[-1]
        # (step, stage, position, phase, computed, outputs): at a step's schedule (stage 0) a
        # request takes a block (phase 0), then registers its filled blocks in the cache (1);
        # as the step's output lands (stage 1) it hashes the block its token fills (0) and,
        # in the last step, finishes (1)
        events = []
        for pos, e in enumerate(out.entries):
            req = e[0]
            seqs[req.id].num_in_flight -= e[1]
            o = req.num_output_tokens
            if o == 0:
                req.first_token = t1
            elif req.last_token == prev_end:
                bulk += 1
            else:
                record_itl(t1 - req.last_token)
            o += 1
            req.num_output_tokens = o
            c = req.num_computed_tokens  # = known tokens before the step's token
            if (c + 1) % bs == 0:  # its token fills a block
                kv.update_hashes(req)
            # follow-on step j computes token c + j - 1, knowing c + j; o + j tokens after it
            j = 1 + (-c) % bs
            while j <= last:
                events.append((j, 0, pos, 0, c, o))
                j += bs
            if caching:
                events.append((1, 0, pos, 1, c, o))  # the first call catches up, as step by step
                j = bs - c % bs or bs
                while j <= last:
                    if j > 1:
                        events.append((j, 0, pos, 1, c, o))
                    j += bs
                j = bs - (c + 1) % bs or bs
                while j <= last:
                    events.append((j, 1, pos, 0, c, o))
                    j += bs
            if o + last >= req.output_len or c + 1 + last >= max_len:
                events.append((last, 1, pos, 1, c, o))
            req.num_computed_tokens = c + last
            req.num_output_tokens = o + last
            req.last_token = t
        plan.num_itl_tokens = bulk
        events.sort()
        # memory changes only with a step's blocks (stage 0) and the last step's finishes, so
        # the rows of the steps between share one state: step j (from ends[j - 1] to ends[j])
        # reads base + size * (j - 1) KV tokens and computes size more; each block taken adds
        # block_size allocated slots. The rows are written before the finishes free blocks.
        rows: list[tuple[int, int, int, int]] | None = None
        alloc = 0
        if pool is not None and pool.series is not None:
            rows = []
            alloc = pool.alloc.allocated_slots
        base = plan.num_kv_tokens + plan.num_tokens
        seen = 1  # the first follow-on step whose row is not written yet
        finished = []
        for j, stage, pos, phase, c, o in events:
            req = running[pos]
            if stage == 0:  # the step's schedule call: rows before it saw the memory as it is
                if rows is not None and seen < j:
                    rows.append((seen, j, base + size * seen, alloc))
                seen = j
                if phase == 0:
                    if not kv.append_block(req):
                        raise AssertionError("a decode run ran out of blocks")
                    alloc += bs
                else:
                    kv.cache_blocks(req, c + j)
            else:  # the step's output, after its row
                if rows is not None and seen <= j:
                    rows.append((seen, j + 1, base + size * seen, alloc))
                seen = j + 1
                if phase == 0:
                    req.num_output_tokens = o + j
                    kv.update_hashes(req)
                    req.num_output_tokens = o + last
                else:
                    if rows is not None:  # before the first finish frees blocks
                        pool.observe_steps(ends, rows, size)  # type: ignore[union-attr]
                        rows = None
                    self._retire(req)
                    finished.append(req)
        if rows is not None:
            if seen <= last:
                rows.append((seen, last + 1, base + size * seen, alloc))
            pool.observe_steps(ends, rows, size)  # type: ignore[union-attr]
        if finished:
            gone = {r.id for r in finished}
            self.running = [r for r in running if r.id not in gone]
            self._finished_since_schedule = True
            finish = ctx.finish
            for req in finished:
                finish(req, t)
