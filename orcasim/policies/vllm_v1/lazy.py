"""The lazy decode path of the vllm-v1 policy: steady decoders as one :class:`DecodeGroup`.

Under synchronous scheduling and without a trace observer, the running
requests that decode one token per schedule call are kept in a
:class:`~orcasim.policies.vllm_v1.group.DecodeGroup` (their counters
against its shared count). A schedule call in which every running request
decodes (the group, plus requests that finished their prefill in the last
step, which join it) costs the group's block boundaries, not its size:
the members that start a block take one (as ``allocate_slots`` would), the
members whose token fills a block register it in the prefix cache, then
the queue is served as usual. Its output costs the members whose token
completes a block of known tokens (a hash) and those that finish.

Anything else (a request mid-prefill, a boundary with no free block, so a
preemption; a cancel; a reader of the running requests) first writes the
members' counters back (:meth:`LazyDecode._sync_group`) and goes the
per-request way of :mod:`orcasim.policies.vllm_v1.schedule`, so the
decisions are the same in both; ``tests/test_vllm_v1_lazy.py`` compares
them.
"""

from __future__ import annotations

from typing import Any

from orcasim.policies.vllm_v1.group import DecodeGroup
from orcasim.policies.vllm_v1.state import KIND_RUNNING, PolicyState, StepOutput
from orcasim.request import Request


class LazyDecode(PolicyState):
    """The decode group of vLLM V1's scheduler (mixed into ``VllmV1``)."""

    #: keep steady decoders in a DecodeGroup (synchronous scheduling, no observer); off:
    #: every running request is scheduled one by one (the reference the tests compare with)
    lazy_decode: bool = True
    _lazy: bool
    _group: DecodeGroup
    _limits: tuple[Any, ...]
    _admit: Any  # Admission._admit
    _admit_fcfs: Any  # Admission._admit_fcfs
    _current: StepOutput | None
    _update_at_end: bool
    _run_t0: float
    _retire: Any  # Output._retire
    _usable: int  # the cache manager's pool's usable blocks

    def _schedule_lazily(self) -> StepOutput | None:
        """The schedule call when every running request decodes one token in a block it
        holds or takes; ``None`` (the group written back) otherwise."""
        g = self._group
        running = self.running
        m = len(g.members)
        size = len(running)
        last_end = self.ctx.last_step_end
        if not size or (m and g.last_end != last_end):
            self._sync_group()
            return None
        limits = self._limits
        kv = self.kv
        bs = g.block_size
        d = g.count
        new = g.buckets[-d % bs]  # members whose next slot starts a block
        num_new = len(new)
        if m < size:  # joiners: they sampled in the last step and computed the rest
            last_slot = limits[1]
            tail = running[m:]
            for req in tail:
                c = req.num_computed_tokens
                o = req.num_output_tokens
                if (o == 0 or c != (req.prompt_len or 1) + o - 1 or c >= last_slot
                        or req.last_token != last_end):
                    self._sync_group()
                    return None
                if c % bs == 0:
                    num_new += 1
            if not self._steady(tail) or num_new > kv.pool.free_queue.num_free_blocks:
                self._sync_group()  # (with too few blocks, someone is preempted)
                return None
            seqs = self.seqs
            join = g.join
            for req in tail:
                join(req, seqs[req.id], req.num_computed_tokens, last_slot + 1)
            g.last_end = last_end  # every member's last token (checked for the joiners)
        elif num_new > kv.pool.free_queue.num_free_blocks:
            self._sync_group()  # someone is preempted
            return None
        if new:
            kv.append_blocks(new)
        if kv.enable_caching:  # blocks filled by this step's token (hashed when they became known)
            seqs = self.seqs
            cache_blocks = kv.cache_blocks
            for req in g.buckets[-(d + 1) % bs]:
                cache_blocks(req, seqs[req.id].base + d + 1)
        g.count = d + 1
        waiting = self.ctx.waiting
        if waiting and size < limits[4]:  # the queue is served as usual (limits[4]: max seqs)
            threshold = limits[2]
            if threshold and size + len(waiting) <= 1:
                threshold = 0
            if limits[5]:  # priority
                out = self._admit(limits[0] - size, threshold, [], {}, [], [], size, size, size)
            else:
                out = self._admit_fcfs(limits[0] - size, threshold, [], [], size, size, size)
        else:  # nobody can join: the step is the group's
            self._finished_since_schedule = False
            out = StepOutput([], [], self._arrivals, size, size, size)
            self._arrivals = []
        out.num_group = size
        out.group_at = d
        g.out = out
        return out

    def _steady(self, reqs: list[Request]) -> bool:
        """Whether ``reqs``, with their computed tokens as they are, hold the blocks of those
        tokens and no more, and have every full block of them in the prefix cache (as
        steady decoders do); the group only touches blocks at boundaries."""
        kv = self.kv
        tables, bs = kv.tables, kv.block_size
        num_cached = kv.num_cached if kv.enable_caching else None
        for req in reqs:
            c = req.num_computed_tokens
            held = len(tables[req.id]) * bs
            if held < c or held - bs >= c:
                return False
            if num_cached is not None and num_cached.get(req.id, 0) < c // bs:
                return False
        return True

    def _group_output(self, out: StepOutput, t_end: float) -> list[Request]:
        """The members' tokens of a step the group scheduled: hashes of the blocks they
        complete, and those that finish (returned, in running order, retired)."""
        g = self._group
        g.out = None
        g.last_end = t_end
        d = g.count
        kv = self.kv
        seqs = self.seqs
        if kv.enable_caching:
            update_hashes = kv.update_hashes
            for req in g.at(1):  # known tokens b + d + 1: a full block
                req.num_output_tokens = seqs[req.id].base + d + 1 - (req.prompt_len or 1)
                update_hashes(req)
        if g.heap[0][0] > d:
            return []
        return self._retire_finished(d, t_end)

    def _retire_finished(self, count: int, t: float) -> list[Request]:
        """The members whose last token the group's step ``count`` sampled at ``t``, in
        running order: out of the group, counters written, retired."""
        done = self._group.pop_finished()
        seqs = self.seqs
        retire = self._retire
        for req in done:
            c = seqs[req.id].base + count
            req.num_computed_tokens = c
            req.num_output_tokens = c + 1 - (req.prompt_len or 1)
            req.last_token = t
            retire(req)
        return done

    def _sync_group(self) -> None:
        """Write the members' counters back and empty the group (a step it scheduled that
        is still in flight gets their entries)."""
        g = self._group
        if not g.members:
            return
        d = g.count
        out = g.out
        lag = 0 if out is None else 1  # in flight: the step's token is not generated yet
        t = g.last_end
        for req, b in zip(g.members, g.bases, strict=True):
            c = b + d
            req.num_computed_tokens = c
            req.num_output_tokens = c + 1 - lag - (req.prompt_len or 1)
            req.last_token = t
        if out is not None:
            n = out.num_group
            out.entries[:0] = [[req, 1, b + d - 1, KIND_RUNNING, True]
                               for req, b in zip(g.members[:n], g.bases[:n], strict=True)]
            out.num_group = 0
        g.clear()

    def _complete_group_run(self, plan: Any, ends: list[float]) -> None:
        """:meth:`~orcasim.policies.vllm_v1.runs.VllmRuns.complete_run` with the decode group.

        The first step's output as :meth:`_update` would apply it (every
        request samples, nobody finishes); its other requests then join the
        group, and the follow-on steps ``1..last`` add ``last`` to the count
        with their block work replayed kind by kind in the per-step order
        (step, then running order), one bucket per step and kind: blocks
        taken at boundaries, hashes of blocks completed by a step's token,
        cache entries of blocks filled by a step's token; then the memory
        rows and the last step's finishes.
        """
        ctx = self.ctx
        out, t1, prev_end = self._run_output(plan, ends)
        g = self._group
        kv = self.kv
        bs = g.block_size
        buckets = g.buckets
        caching = kv.enable_caching
        seqs = self.seqs
        last = len(ends) - 1  # the follow-on steps are 1..last; nobody finishes before the last
        t = ends[-1]
        d = g.count
        bulk = out.num_group  # members: each emitted in the step before too
        if bulk:
            g.out = None
            if caching:
                update_hashes = kv.update_hashes
                for req in buckets[-(d + 1) % bs]:  # known tokens b + d + 1: a full block
                    req.num_output_tokens = seqs[req.id].base + d + 1 - (req.prompt_len or 1)
                    update_hashes(req)
        entries = out.entries
        if entries:  # the listed requests (after the members), joining after their output
            record_itl = ctx.recorder.record_itl
            max_len = self._limits[1] + 1
            join = g.join
            for e in entries:
                req = e[0]
                o = req.num_output_tokens
                if o == 0:
                    req.first_token = t1
                elif req.last_token == prev_end:
                    bulk += 1
                else:
                    record_itl(t1 - req.last_token)
                req.num_output_tokens = o + 1
                req.last_token = t1
                c = req.num_computed_tokens  # = known tokens before the step's token
                if caching and (c + 1) % bs == 0:  # its token completes a block
                    kv.update_hashes(req)
                join(req, seqs[req.id], c, max_len)
        plan.num_itl_tokens = bulk
        # new blocks, and the slots allocated in each step (its memory row): the first step's
        # as scheduled, follow-on step j's after its boundaries (base + d + j - 1 a multiple
        # of the block size) took theirs
        pool = self.pool
        series = pool is not None and pool.series is not None
        # the allocator's allocated_slots: the blocks its pool (the cache manager's) holds
        alloc = (self._usable - kv.pool.free_queue.num_free_blocks) * bs if series else 0
        allocs = [alloc]
        new = g.boundary_blocks(d, d + last, alloc, allocs)
        if new and not kv.append_blocks(new):
            raise AssertionError("a decode run ran out of blocks")
        if caching:
            update_hashes = kv.update_hashes
            for j in range(1, last + 1):  # step j's token completes base + d + j + 1 tokens
                for req in buckets[-(d + j + 1) % bs]:
                    req.num_output_tokens = seqs[req.id].base + d + j + 1 - (req.prompt_len or 1)
                    update_hashes(req)
            cache_blocks = kv.cache_blocks
            for j in range(1, last + 1):  # step j's token fills base + d + j tokens
                for req in buckets[-(d + j) % bs]:
                    cache_blocks(req, seqs[req.id].base + d + j)
        g.count = count = d + last
        g.last_end = t
        if series:  # every step's row, before finishes free blocks
            # step j (from ends[j - 1] to ends[j]) reads the first step's tokens + size * j
            pool.observe_run(self._run_t0, ends,  # type: ignore[union-attr]
                             plan.num_kv_tokens + plan.num_tokens, len(g.members), allocs,
                             [pool.alloc.internal_slots] * (last + 1),  # type: ignore[union-attr]
                             False, True)  # (allocs only grow)
        if g.heap[0][0] <= count:
            finishing = self._retire_finished(count, t)
            running = self.running
            for req in finishing:
                running.remove(req)
            self._finished_since_schedule = True
            ctx.finish_all(finishing, t)  # (ctx.finish of each in turn)
