"""Admission from the waiting queue at the end of one vLLM V1 ``schedule()`` call.

:class:`Admission` serves the queue after the running requests (none after a
preemption): each request at the head is admitted with its prefix-cache hit
while the budget, ``max_num_seqs`` and the free blocks allow, the first one
that does not fit blocking the rest; then every scheduled entry's computed
tokens are advanced, so the next step can be scheduled at once.
"""

from __future__ import annotations

from typing import Any

from orcasim.policies.vllm_v1.state import (
    KIND_NEW,
    KIND_RESUMED,
    RUNNING,
    PolicyState,
    StepOutput,
)
from orcasim.request import Request

_NO_HIT: tuple[list[Any], int] = ([], 0)  # no prefix-cache hit (never changed: only read)


class Admission(PolicyState):
    """The admissions of vLLM V1's scheduler (mixed into ``VllmV1``)."""

    watermark_blocks: int
    num_prompt_tokens_admitted: int
    num_prefix_hit_tokens: int
    _arrivals: list[Request]
    _limits: tuple[Any, ...]
    _refused: tuple[Any, ...] | None = None  # the last admission refused, as _admit keys it
    _enqueue_front: Any  # Scheduling._enqueue_front

    def _admit(self, budget: int, threshold: int, entries: list[list[Any]],
               scheduled: dict[int, list[Any]], preempted: list[Request],
               pending: list[list[Any]], num_tokens: int, num_emits: int,
               num_decode: int) -> StepOutput:
        """The rest of a schedule call, after the running requests: admissions from the
        queue (none after a preemption), then every entry's computed tokens advanced.
        Under priority or async scheduling (synchronous FCFS: :meth:`_admit_fcfs`).

        ``num_tokens``, ``num_emits`` and ``num_decode`` count the entries already
        advanced (not in ``pending``): their tokens, those that sample, and the decodes.
        """
        kv, seqs, running = self.kv, self.seqs, self.running
        waiting = self.ctx.waiting
        limits = self._limits
        max_num_seqs, priority = limits[4], limits[5]
        if not preempted and budget > 0 and waiting and len(running) < max_num_seqs:
            skipped: list[Request] = []
            p = self.params
            chunked = p.enable_chunked_prefill
            reserve = p.scheduler_reserve_full_isl
            caching = kv.enable_caching
            pool = kv.pool
            while budget > 0 and waiting and len(running) < max_num_seqs:
                req = waiting[0]
                seq = seqs[req.id]
                if seq.num_stale:  # a step of it is still in flight
                    skipped.append(waiting.popleft())
                    continue
                # the same request refused with everything it is decided on unchanged (its
                # tokens, the blocks and cache, the budget) is refused again
                refused = self._refused
                if refused is not None and refused[0] is req and refused == (
                        req, req.num_output_tokens, pool.version, budget, threshold,
                        bool(running)):
                    break
                hit, num_hit = kv.get_computed_blocks(req) if caching else _NO_HIT
                n = seq.num_prompt + req.num_output_tokens - num_hit  # req.num_tokens - hit
                if 0 < threshold < n:
                    n = threshold
                if not chunked and n > budget:
                    self._refused = (req, req.num_output_tokens, pool.version, budget,
                                     threshold, bool(running))
                    break
                if n > budget:
                    n = budget
                watermark = self.watermark_blocks if running else 0
                if not (kv.allocate_fresh(req, n, reserve, watermark) if not hit
                        and req.id not in kv.tables else
                        kv.allocate_slots(req, n, hit, num_hit, full_sequence_must_fit=reserve,
                                          watermark_blocks=watermark) is not None):
                    self._refused = (req, req.num_output_tokens, pool.version, budget,
                                     threshold, bool(running))
                    break
                waiting.popleft()
                running.append(req)
                kind = KIND_RESUMED if req.num_preemptions else KIND_NEW
                if kind == KIND_NEW:
                    prompt_len = req.prompt_len
                    self.num_prompt_tokens_admitted += prompt_len
                    self.num_prefix_hit_tokens += num_hit if num_hit < prompt_len else prompt_len
                e = [req, n, num_hit, kind, False]  # advanced by the pass below
                if priority:
                    scheduled[req.id] = e
                else:
                    entries.append(e)
                    pending.append(e)
                budget -= n
                seq.status = RUNNING
                req.num_computed_tokens = num_hit
                self.ctx.admit(req)
            for req in reversed(skipped):
                self._enqueue_front(req)

        # advance the computed tokens now, so the next step can be scheduled at once
        use_placeholders = limits[3]
        if priority:
            entries = list(scheduled.values())
        for e in entries if priority else pending:
            if e[4]:  # advanced at once
                continue
            req, n = e[0], e[1]
            seq = seqs[req.id]
            if n == 1 and e[2] >= seq.num_prompt:
                num_decode += 1
            c = req.num_computed_tokens + n
            req.num_computed_tokens = c
            num_tokens += n
            if use_placeholders:
                seq.num_in_flight += n
                if c >= seq.num_prompt + req.num_output_tokens + seq.num_placeholders:
                    e[4] = True
                    num_emits += 1
                    seq.num_placeholders += 1
            elif c >= seq.num_prompt + req.num_output_tokens:
                e[4] = True
                num_emits += 1
        self._finished_since_schedule = False
        out = StepOutput(entries, preempted, self._arrivals, num_tokens, num_decode, num_emits)
        self._arrivals = []
        return out

    def _admit_fcfs(self, budget: int, threshold: int, entries: list[list[Any]],
                    preempted: list[Request], num_tokens: int, num_emits: int,
                    num_decode: int) -> StepOutput:
        """:meth:`_admit` under synchronous FCFS scheduling, where every entry is advanced
        when it is scheduled: nothing is in flight (no stale request to skip, no pass at
        the end) and an admission is listed in order."""
        running = self.running
        waiting = self.ctx.waiting
        max_num_seqs = self._limits[4]
        if not preempted and budget > 0 and waiting and len(running) < max_num_seqs:
            kv, seqs = self.kv, self.seqs
            p = self.params
            chunked = p.enable_chunked_prefill
            reserve = p.scheduler_reserve_full_isl
            caching = kv.enable_caching
            pool = kv.pool
            tables = kv.tables
            admit = self.ctx.admit
            append = entries.append
            while True:
                req = waiting[0]
                seq = seqs[req.id]
                num_out = req.num_output_tokens
                refused = self._refused  # refused again with nothing changed (see _admit)
                if refused is not None and refused[0] is req and refused == (
                        req, num_out, pool.version, budget, threshold, bool(running)):
                    break
                hit, num_hit = kv.get_computed_blocks(req) if caching else _NO_HIT
                num_prompt = seq.num_prompt
                known = num_prompt + num_out  # req.num_tokens
                n = known - num_hit
                if 0 < threshold < n:
                    n = threshold
                if n > budget:
                    if not chunked:
                        self._refused = (req, num_out, pool.version, budget, threshold,
                                         bool(running))
                        break
                    n = budget
                watermark = self.watermark_blocks if running else 0
                if not (kv.allocate_fresh(req, n, reserve, watermark) if not hit
                        and req.id not in tables else
                        kv.allocate_slots(req, n, hit, num_hit, full_sequence_must_fit=reserve,
                                          watermark_blocks=watermark) is not None):
                    self._refused = (req, num_out, pool.version, budget, threshold,
                                     bool(running))
                    break
                waiting.popleft()
                running.append(req)
                if req.num_preemptions:
                    kind = KIND_RESUMED
                else:
                    kind = KIND_NEW
                    prompt_len = req.prompt_len
                    self.num_prompt_tokens_admitted += prompt_len
                    self.num_prefix_hit_tokens += num_hit if num_hit < prompt_len else prompt_len
                c = num_hit + n
                emits = c >= known
                append([req, n, num_hit, kind, emits])
                budget -= n
                seq.status = RUNNING
                req.num_computed_tokens = num_hit
                admit(req)
                req.num_computed_tokens = c
                num_tokens += n
                if emits:
                    num_emits += 1
                if n == 1 and num_hit >= num_prompt:
                    num_decode += 1
                if budget <= 0 or not waiting or len(running) >= max_num_seqs:
                    break
        self._finished_since_schedule = False
        out = StepOutput(entries, preempted, self._arrivals, num_tokens, num_decode, num_emits)
        self._arrivals = []
        return out
