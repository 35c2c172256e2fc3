"""Runs of the vllm-v1 policy chained after a run's finishes (no SimPy).

A run of all-decode steps (:mod:`orcasim.policies.vllm_v1.runs`) ends at the
first step in which a running request samples its last token. When nobody
waits, the next schedule call is the decode group's step with the requests
left, and so on at each finish: :meth:`ChainedRuns._chain_after` gives those
runs (batch size, the first step's KV tokens, steps) as the engine asks for
them, up to the next arrival, and :meth:`ChainedRuns._complete_chain` applies
each as the per-step engine would, its schedule call at the previous one's
end (``tests/test_vllm_v1_runs.py`` compares both).
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heappop, heappush
from typing import Any

from orcasim.plan import StepPlan
from orcasim.policies.vllm_v1.state import PolicyState
from orcasim.request import Request

#: runs chained after one run's finishes at most
MAX_CHAIN = 64


class ChainedRuns(PolicyState):
    """The runs after a run's finishes (mixed into ``VllmV1`` through ``VllmRuns``)."""

    #: chain the runs that follow a run's finishes while nobody waits into one engine run
    #: (off: the engine takes each run after a finish as a run of its own)
    chain_runs: bool = True
    _group: Any  # DecodeGroup
    _run_t0: float
    _chain: Any  # VllmRuns._chain
    _current: Any
    _update_at_end: bool
    complete_step: Any  # VllmV1.complete_step
    _complete_group_run: Any  # LazyDecode._complete_group_run
    _schedule_lazily: Any  # LazyDecode._schedule_lazily
    _retire_finished: Any  # LazyDecode._retire_finished
    _plan: Any  # Output._plan
    _usable: int  # the cache manager's pool's usable blocks

    def _chainable(self) -> bool:
        """Whether a finish inside a run changes nothing but the batch: nobody waits, and
        nobody listens to finishes, freed slots or freed memory."""
        ctx = self.ctx
        pool = self.pool
        slots = ctx.slots
        return (not ctx.waiting and ctx.on_end is None and not slots._getters
                and slots._freed is None
                and (pool is None or (pool._freed is None and not pool._getters)))

    def _chain_after(self, listed: list[Request], left: int, free: int, bs: int, max_len: int,
                     chain: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
        """The runs that follow the run's finishes while nobody waits: ``(size, kv, steps)``
        each, ``kv`` the KV tokens of its first step (the decode group's step), made as the
        engine asks for them (up to the next arrival) and kept in ``chain``.

        The group's members (the listed requests join it after the first step, based
        on the count after it, ``C``) each sample their last token at a count ``L``
        (:meth:`DecodeGroup.join`); the first run ends at the least. A following run
        starts with the members left, each decoding from ``base + L`` computed tokens,
        and ends at the next least ``L``. Blocks are counted at most: a member takes at
        most ``1 + (steps - 1) // block_size`` in ``steps`` steps and finishers free none,
        and the runs go on while the blocks of all of them fit in the free ones.
        """
        g = self._group
        count = g.count
        seqs = self.seqs
        # the members' last counts, least first, taken from a copy of the group's heap as
        # far as the engine asks (the listed requests are not members yet: negative keys)
        items = g.heap[:]
        total = g.total  # (sum(g.bases))
        for i, r in enumerate(listed):
            base = r.num_computed_tokens - count
            total += base
            last = r.output_len + (r.prompt_len or 1)  # min(last, max_len), written out
            heappush(items, ((last if last < max_len else max_len) - 1 - base,
                             -1 - i, r))
        n = len(items)
        end = count + left - 1  # the count the first run ends at
        used = n * (1 + (left - 2) // bs)  # the first run's follow-on steps' blocks at most
        while len(chain) < MAX_CHAIN:
            last = items[0][0]
            while last == end:  # this run's finishers leave
                _, key, r = heappop(items)
                total -= seqs[r.id].base if key >= 0 else r.num_computed_tokens - count
                n -= 1
                if not n:
                    return
                last = items[0][0]
            used += n * (1 + (last - end - 1) // bs)
            if used > free:
                return
            run = (n, total + n * end, last - end)
            chain.append(run)
            yield run
            end = last

    def _complete_chain(self, plan: StepPlan, ends: list[float], first: int,
                        chain: list[tuple[int, int, int]]) -> None:
        """:meth:`complete_run` of a run and the runs chained after its finishes
        (:meth:`_chain_after`), each as the step-by-step engine takes it: the run's steps,
        then at its end the next schedule call (the decode group's step, nobody waiting)
        and its steps, up to the last end the engine gives."""
        ctx = self.ctx
        self._complete_part(plan, ends[:first], self._run_t0)
        pos = first
        k = len(ends)
        plain = not self.kv.enable_caching
        for n, kv, steps in chain:
            if pos >= k:
                break
            t0 = ends[pos - 1]
            if plain and len(self._group.members) == n:  # (else some join the group first)
                self._plain_part(n, kv, ends[pos:pos + steps], t0)
                pos += steps
                continue
            ctx.last_step_end = t0
            out = self._schedule_lazily()
            if out is None or out.num_group != n or out.entries:
                raise AssertionError("a chained run is not the decode group's")
            self._update_at_end = True
            self._current = out
            self._complete_part(self._plan(out), ends[pos:pos + steps], t0)
            pos += steps

    def _plain_part(self, n: int, kv_first: int, ends: list[float], t0: float) -> None:
        """A chained run without prefix caching, from ``t0``: what the decode group's
        schedule call (:meth:`~orcasim.policies.vllm_v1.lazy.LazyDecode._schedule_lazily`,
        nobody waiting) and its run (:meth:`complete_step` or ``_complete_group_run``) do,
        in one pass: the blocks taken at boundaries, step by step, the memory rows
        (``kv_first``: the first step's KV tokens) and the finishes of the last step."""
        g = self._group
        kv = self.kv
        bs = g.block_size
        d = g.count
        s = len(ends)
        pool = self.pool
        series = pool is not None and pool.series is not None
        alloc = (self._usable - kv.pool.free_queue.num_free_blocks) * bs if series else 0
        allocs: list[int] = []
        new = g.boundary_blocks(d, d + s, alloc, allocs)
        if new and not kv.append_blocks(new):
            raise AssertionError("a chained run ran out of blocks")
        g.count = count = d + s
        t = ends[-1]
        g.last_end = t
        self._finished_since_schedule = False
        if series:
            assert pool is not None
            if s == 1:
                pool.observe(t0, t, kv_first + n, False)
            else:
                pool.observe_run(t0, ends, kv_first + n, n, allocs,
                                 [pool.alloc.internal_slots] * s, False, True)
        if g.heap[0][0] <= count:
            finishing = self._retire_finished(count, t)
            running = self.running
            for req in finishing:
                running.remove(req)
            self._finished_since_schedule = True
            self.ctx.finish_all(finishing, t)  # (ctx.finish of each in turn)

    def _complete_part(self, plan: StepPlan, ends: list[float], t0: float) -> None:
        """One run of a chain from ``t0``: a step, or the group's run."""
        if len(ends) == 1:
            self.complete_step(plan, t0, ends[0])
        else:
            self._run_t0 = t0
            self._complete_group_run(plan, ends)
