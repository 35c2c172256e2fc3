"""One vLLM V1 ``schedule()`` call.

:class:`Scheduling` holds the decisions of :class:`~orcasim.policies.vllm_v1.VllmV1`:
the waiting queue's order, the running-first token budget with recompute
preemption and admission with prefix-cache hits. The processing of a step's
output is :mod:`orcasim.policies.vllm_v1.output`.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from orcasim.policies.vllm_v1.state import (
    KIND_RUNNING,
    PREEMPTED,
    PolicyState,
    Seq,
    StepOutput,
    misfit,
)
from orcasim.request import Request


class Scheduling(PolicyState):
    """The schedule of vLLM V1's scheduler (mixed into ``VllmV1``)."""

    priority: bool
    _arrivals: list[Request]
    _held: deque[Request]
    _lagged: bool
    _queue: deque[StepOutput]
    _scheduled_at: float
    _limits: tuple[Any, ...]
    _fit: tuple[int, int, int]
    _sync_fcfs: bool
    _admit: Any  # Admission._admit
    _admit_fcfs: Any  # Admission._admit_fcfs
    _lazy: bool
    _schedule_lazily: Any  # LazyDecode._schedule_lazily

    @staticmethod
    def _order(req: Request) -> tuple[int, float, int]:
        return (req.priority, req.arrival, req.id)

    def _enqueue_front(self, req: Request) -> None:
        if self.priority:
            bisect.insort(self.ctx.waiting, req, key=self._order)
        else:
            self.ctx.waiting.appendleft(req)

    def _take_arrivals(self) -> None:
        """Move requests the source just appended to ``ctx.waiting`` into the policy's queue.

        The source only appends at the right; the policy reorders the queue only
        during a schedule call, right after taking the new arrivals, so the
        requests it does not know yet are exactly those at the right end.

        With ``async_scheduling`` and ``input_lag``, vLLM's engine loop takes new
        requests only at the start of an iteration, and the iteration that
        schedules the next step began when the step now running started: a
        request that arrived after that start waits in ``_held`` (not yet in
        the scheduler, as in vLLM's input queue) for the following schedule call.
        """
        ctx = self.ctx
        src = ctx.source  # ctx.poll_arrivals(), inline: once per schedule call
        if src is not None and src.pending_until(ctx.env._now):
            src.flush(ctx.env._now)
        waiting, seqs = ctx.waiting, self.seqs
        if self._lagged:
            self._hold_late(waiting, seqs)
        if not waiting:
            return
        priority = self.priority
        fresh = []
        if priority:  # each is inserted in key order
            while waiting and waiting[-1].id not in seqs:
                fresh.append(waiting.pop())
        else:  # they stay where they are, in arrival order
            for req in reversed(waiting):
                if req.id in seqs:
                    break
                fresh.append(req)
        if not fresh:
            return
        caching = self.kv.enable_caching
        max_len, bs, usable = self._fit
        for req in reversed(fresh):
            prompt_len = req.prompt_len
            need = (prompt_len or 1) + req.output_len - 1  # its slots alone, at most max_len
            if need > max_len:
                need = max_len
            if (prompt_len > max_len  # misfit's tests, inline; misfit says why
                    or (need + bs - 1) // bs > usable) and (found := misfit(
                        prompt_len, req.output_len, self.params)) is not None:
                if not priority:
                    waiting.remove(req)
                ctx.reject(req, found[0])
                continue
            seqs[req.id] = Seq(req, max_len)
            if caching:
                self.kv.update_hashes(req)
            self._arrivals.append(req)
            if priority:
                bisect.insort(waiting, req, key=self._order)

    def _hold_late(self, waiting: Any, seqs: dict[int, Seq]) -> None:
        """Keep arrivals after the running step's schedule call out of ``waiting``."""
        held = self._held
        fresh = []
        while waiting and waiting[-1].id not in seqs:
            fresh.append(waiting.pop())
        if fresh:
            fresh.reverse()
            held.extend(fresh)  # the held ones arrived before these
        if not held:
            return
        cutoff = self._scheduled_at if any(o.num_tokens for o in self._queue) else self.ctx.now
        while held and held[0].arrival <= cutoff:
            waiting.append(held.popleft())

    def _set_limits(self) -> None:
        """Bind what every schedule call reads: the configuration and the cache manager's
        tables (``_limits``)."""
        p, kv = self.params, self.kv
        self._limits = (p.max_num_batched_tokens, p.max_model_len - 1,
                        p.long_prefill_token_threshold, p.async_scheduling, p.max_num_seqs,
                        self.priority, kv.tables, kv.num_cached, kv.append_block, kv.block_size,
                        kv.enable_caching)
        self._sync_fcfs = not (self.priority or p.async_scheduling)  # see _schedule_fcfs
        # what misfit compares with: max_model_len, block size, usable blocks
        self._fit = (p.max_model_len, p.block_size, p.num_blocks - 1)

    def _has_requests(self) -> bool:
        return bool(self.running or self.ctx.waiting or self._finished_since_schedule)

    # -- one schedule() call -----------------------------------------------------------
    def _fit_fcfs(self, req: Request, n: int, running: list[Request],
                  preempted: list[Request]) -> bool:
        """Slots for ``n`` more of ``req``'s tokens, preempting the last running request
        until they fit (first come first served); False when ``req`` itself was preempted."""
        while self.kv.allocate_slots(req, n) is None:
            victim = running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        seq = self.seqs[req.id]
        self.ctx.preempted(req, "kv_full", recompute=req.num_computed_tokens)
        self.kv.free(req)
        seq.status = PREEMPTED
        seq.num_stale = seq.num_in_flight
        seq.num_placeholders = 0
        req.num_computed_tokens = 0
        self._enqueue_front(req)
        if self.pool is not None:
            self.pool.released()

    def _schedule(self) -> StepOutput:
        if self._lazy:  # every running request decodes: the decode group's way
            out = self._schedule_lazily()
            if out is not None:
                return out
        if self._sync_fcfs:
            return self._schedule_fcfs()
        kv, seqs, running = self.kv, self.seqs, self.running
        waiting = self.ctx.waiting
        # the configuration (fixed for the run), read once per call
        (budget, last_slot, threshold, use_placeholders, _, priority, tables,
         num_cached, append_block, bs, caching) = self._limits
        if threshold and len(running) + len(waiting) <= 1:
            threshold = 0
        # entries [req, n, start, kind, emits] in order; under priority a victim's entry is
        # taken back, so they are kept by request id until the end
        entries: list[list[Any]] = []
        scheduled: dict[int, list[Any]] = {}
        preempted: list[Request] = []
        pending: list[list[Any]] = []  # entries advanced by the pass at the end
        num_decode = num_lazy = 0
        if not priority:
            # FCFS with async scheduling (synchronous FCFS is _schedule_fcfs) takes victims
            # from the end of the list, after the request being scheduled, so the iteration
            # stops before them and a scheduled request stays scheduled: a lazy decode is
            # advanced at once
            for req in running:
                if budget <= 0:
                    break
                computed = req.num_computed_tokens
                seq = seqs[req.id]
                placeholders = seq.num_placeholders
                num_prompt = seq.num_prompt
                if placeholders and computed + 2 - placeholders >= num_prompt + req.output_len:
                    continue  # its last token is already in flight
                known = num_prompt + req.num_output_tokens  # req.num_tokens
                n = known + placeholders - computed
                if n == 1 and computed < last_slot and (computed % bs
                                                         or len(tables[req.id]) * bs > computed
                                                         or append_block(req)):
                    # the lazy decode path: its slot is in a block it holds, or starts a
                    # block that it took (what allocate_slots would do); only a block of
                    # known tokens just filled is cached. It computes its last known token:
                    # it samples.
                    m = computed + 1 if computed < known else known
                    if caching and m // bs > num_cached.get(req.id, 0):
                        kv.cache_blocks(req, m)
                    budget -= 1
                    entries.append([req, 1, computed, KIND_RUNNING, True])
                    req.num_computed_tokens = computed + 1
                    num_lazy += 1
                    if computed >= num_prompt:
                        num_decode += 1
                    seq.num_in_flight += 1
                    seq.num_placeholders += 1
                    continue
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget, last_slot - computed)
                if n <= 0:
                    continue
                if not self._fit_fcfs(req, n, running, preempted):
                    break  # it was preempted itself: nothing after it runs
                e = [req, n, computed, KIND_RUNNING, False]
                entries.append(e)
                pending.append(e)
                budget -= n
        else:
            # a victim may come from before the request being scheduled (its entry is
            # taken back): every entry is advanced by the pass at the end
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                rid = req.id
                seq = seqs[rid]
                computed = req.num_computed_tokens
                placeholders = seq.num_placeholders
                if placeholders and computed + 2 - placeholders >= seq.num_prompt + req.output_len:
                    i += 1  # its last token is already in flight
                    continue
                known = seq.num_prompt + req.num_output_tokens  # req.num_tokens
                n = known + placeholders - computed
                if n == 1 and computed < last_slot and (computed % bs
                                                         or len(tables[rid]) * bs > computed
                                                         or append_block(req)):
                    m = computed + 1 if computed < known else known  # the lazy decode path
                    if caching and m // bs > num_cached.get(rid, 0):
                        kv.cache_blocks(req, m)
                    budget -= 1
                    i += 1
                    if use_placeholders:  # advanced by the pass at the end
                        scheduled[rid] = [req, 1, computed, KIND_RUNNING, False]
                    else:  # advanced at once (were it taken back, its preemption resets it)
                        scheduled[rid] = [req, 1, computed, KIND_RUNNING, True]
                        req.num_computed_tokens = computed + 1
                        num_lazy += 1
                        if computed >= seq.num_prompt:
                            num_decode += 1
                    continue
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget, last_slot - computed)
                if n <= 0:
                    i += 1
                    continue
                fits = True
                while kv.allocate_slots(req, n) is None:
                    victim = max(running, key=self._order)
                    j = running.index(victim)
                    del running[j]
                    if j < i:
                        i -= 1
                    gone = scheduled.pop(victim.id, None)
                    if gone is not None:
                        budget += gone[1]
                        if gone[4]:  # advanced at once: not in this step after all
                            num_lazy -= 1
                            if gone[2] >= seqs[victim.id].num_prompt:
                                num_decode -= 1
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        fits = False
                        break
                if not fits:
                    continue  # it left the list; the requests after it may still fit
                scheduled[rid] = [req, n, computed, KIND_RUNNING, False]
                budget -= n
                i += 1

        return self._admit(budget, threshold, entries, scheduled, preempted, pending,
                           num_lazy, num_lazy, num_decode)

    def _schedule_fcfs(self) -> StepOutput:
        """:meth:`_schedule` under synchronous FCFS scheduling: no placeholders (nothing is
        in flight at a schedule call), and every entry advanced as soon as it is scheduled
        (a victim comes from the end of the running list, after the request being
        scheduled, and the iteration stops at a request preempted itself)."""
        kv, running = self.kv, self.running
        (budget, last_slot, threshold, _, _, _, tables, num_cached, append_block, bs,
         caching) = self._limits
        if threshold and len(running) + len(self.ctx.waiting) <= 1:
            threshold = 0
        entries: list[list[Any]] = []
        append = entries.append
        fit = self._fit_fcfs
        preempted: list[Request] = []
        num_tokens = num_emits = num_decode = num_lazy = 0
        for req in running:
            if budget <= 0:
                break
            computed = req.num_computed_tokens
            num_prompt = req.prompt_len or 1  # seq.num_prompt
            known = num_prompt + req.num_output_tokens  # req.num_tokens
            n = known - computed
            if n == 1 and computed < last_slot and (
                    computed % bs or len(tables[req.id]) * bs > computed or append_block(req)):
                # the lazy decode path: its slot is in a block it holds (inside a block: the
                # one of its last computed token), or starts a block that it took (what
                # allocate_slots would do); only a block of known tokens just filled is
                # cached (its earlier full blocks were at their own steps). It computes its
                # last known token: it samples (one token, one emit: counted at the end).
                computed += 1
                if caching and not computed % bs and computed // bs > num_cached.get(req.id, 0):
                    kv.cache_blocks(req, computed)
                budget -= 1
                append([req, 1, computed - 1, KIND_RUNNING, True])
                req.num_computed_tokens = computed
                num_lazy += 1
                if computed > num_prompt:
                    num_decode += 1
                continue
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, last_slot - computed)
            if n <= 0:
                continue
            if not fit(req, n, running, preempted):
                break  # it was preempted itself: nothing after it runs
            c = computed + n
            emits = c >= known
            append([req, n, computed, KIND_RUNNING, emits])
            req.num_computed_tokens = c
            budget -= n
            num_tokens += n
            if emits:
                num_emits += 1
            if n == 1 and computed >= num_prompt:
                num_decode += 1
        if preempted or budget <= 0 or not self.ctx.waiting or len(running) >= self._limits[4]:
            # nobody can be admitted: the step's output, as _admit_fcfs would make it
            self._finished_since_schedule = False
            out = StepOutput(entries, preempted, self._arrivals, num_tokens + num_lazy,
                             num_decode, num_emits + num_lazy)
            self._arrivals = []
            return out
        return self._admit_fcfs(budget, threshold, entries, preempted, num_tokens + num_lazy,
                                num_emits + num_lazy, num_decode)
