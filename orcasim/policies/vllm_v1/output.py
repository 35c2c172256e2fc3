"""The processing of a vLLM V1 step's output, and the step's plan for the engine.

:class:`Output` applies a finished step's sampled tokens to the requests of
:class:`~orcasim.policies.vllm_v1.VllmV1` (first tokens, inter-token gaps,
hashes of filled blocks, finishes) and turns a schedule call into the
engine's :class:`~orcasim.plan.StepPlan`.
"""

from __future__ import annotations

from itertools import repeat
from operator import add, itemgetter
from typing import Any

from orcasim.plan import StepPlan
from orcasim.policies.vllm_v1.state import RUNNING, PolicyState, StepOutput
from orcasim.request import Request


class Output(PolicyState):
    """The output update and the plan of vLLM V1's scheduler (mixed into ``VllmV1``)."""

    _group_output: Any  # LazyDecode._group_output
    _group: Any  # DecodeGroup
    #: the plan of a step of the decode group alone carries only its sizes, not the list of
    #: requests and contexts (set by the engine when its latency model times an all-decode
    #: step from them: the same time either way)
    plans_by_aggregates: bool = False
    #: with ``plans_by_aggregates``, so is the plan of the group's step with one more request
    #: that computes one token or a prompt from its start (set by the engine when its latency
    #: model times that step from its sizes too)
    prefill_plans_by_aggregates: bool = False
    #: every plan carries only its sizes (requests, KV tokens, prefill and decode tokens), no
    #: list of requests and contexts: for a run whose latency model and recorder read nothing
    #: else (a step-clock trace, :func:`~orcasim.steptrace.run_trace`)
    plans_by_sizes: bool = False

    # -- processing a step's output ----------------------------------------------------
    def _update(self, out: StepOutput, plan: StepPlan | None = None) -> None:
        """Apply a step's sampled tokens (``plan``: the step being completed, for its ITL count)."""
        kv, seqs, ctx = self.kv, self.seqs, self.ctx
        p = self.params
        block_size = p.block_size
        hashing = kv.enable_caching
        t_end, prev_end = out.t_end, out.prev_end
        bulk = 0
        finished: list[Request] = []
        if out.num_group:  # the decode group's members: each emitted in the step before too
            bulk = out.num_group
            finished = self._group_output(out, t_end)
        queued: set[int] | None = None  # finished requests that were in the queue
        record_itl = ctx.recorder.record_itl
        if not p.async_scheduling:  # one step in flight: no placeholders, nothing stale;
            # only the entries that sample change
            for req, _, _, _, emits in out.entries:
                if not emits:
                    continue
                seq = seqs.get(req.id)
                if seq is None:  # cancelled
                    continue
                num_out = req.num_output_tokens
                if num_out == 0:
                    req.first_token = t_end
                elif req.last_token == prev_end:
                    bulk += 1
                else:
                    record_itl(t_end - req.last_token)  # type: ignore[operator]
                num_out += 1
                req.num_output_tokens = num_out
                req.last_token = t_end
                known = seq.num_prompt + num_out  # req.num_tokens
                if hashing and known % block_size == 0:  # a block of known tokens just filled
                    kv.update_hashes(req)
                if known >= seq.num_last:  # (its output, or a full context)
                    if seq.status != RUNNING:
                        queued = {req.id} if queued is None else queued | {req.id}
                    self._retire(req)
                    finished.append(req)
        else:  # async: every entry's in-flight tokens land; those that sample emit
            for req, n, _, _, emits in out.entries:
                seq = seqs.get(req.id)
                if seq is None:  # finished by an earlier step's output
                    continue
                seq.num_in_flight -= n
                stale = seq.num_stale > 0
                if stale:
                    seq.num_stale -= n
                if not emits:
                    continue
                num_out = req.num_output_tokens
                if num_out == 0:
                    req.first_token = t_end
                elif req.last_token == prev_end:
                    bulk += 1
                else:
                    record_itl(t_end - req.last_token)  # type: ignore[operator]
                num_out += 1
                req.num_output_tokens = num_out
                req.last_token = t_end
                known = seq.num_prompt + num_out  # req.num_tokens
                if hashing and known % block_size == 0:  # a block of known tokens just filled
                    kv.update_hashes(req)
                if seq.num_placeholders and not stale:
                    seq.num_placeholders -= 1
                    if seq.status == RUNNING and hashing:  # (cache_blocks is a no-op otherwise)
                        m = req.num_computed_tokens - seq.num_in_flight
                        if m // block_size > kv.num_cached.get(req.id, 0):  # a new full block
                            kv.cache_blocks(req, m)
                if known >= seq.num_last:  # (its output, or a full context)
                    if seq.status != RUNNING:  # its last token came after it was preempted
                        queued = {req.id} if queued is None else queued | {req.id}
                    self._retire(req)
                    finished.append(req)
        if plan is not None:
            plan.num_itl_tokens = bulk
        elif bulk:
            record_itl(t_end - prev_end, bulk)
        if finished:
            self._leave(finished, queued, t_end)
        if self._observer is not None:
            self._observer.updated(self, out, finished)

    def _leave(self, finished: list[Request], queued: set[int] | None, t_end: float) -> None:
        """Take finished requests out of the running list (``queued``: ids of those in the
        queue, out of it; None: none) and record them."""
        ctx = self.ctx
        if queued is None or len(queued) < len(finished):
            gone = {r.id for r in finished}
            self.running = [r for r in self.running if r.id not in gone]
        if queued:
            kept = [r for r in ctx.waiting if r.id not in queued]
            ctx.waiting.clear()
            ctx.waiting.extend(kept)
        self._finished_since_schedule = True
        ctx.finish_all(finished, t_end)  # (ctx.finish of each in turn)

    def _retire(self, req: Request) -> None:
        """``req`` sampled its last token: its counters, blocks and hashes go (the caller
        takes it out of its list and records it)."""
        if req.num_output_tokens < req.output_len:
            req.reason = "max_model_len"  # finished early: the context is full
        rid = req.id
        del self.seqs[rid]
        kv = self.kv
        kv.free(req)
        kv.hashes.pop(rid, None)  # kv.forget(req)
        if self.pool is not None:
            self.pool.released()

    # -- the engine loop (vLLM's EngineCore with a batch queue) ----------------------------
    def _plan(self, out: StepOutput) -> StepPlan:
        """The step's plan: one token of a request past its prompt is a decode."""
        entries = out.entries
        n = out.num_group
        if n:  # the decode group's members come first: (member, 1), base + count before
            g = self._group
            if self.plans_by_aggregates:
                # the members' KV tokens (every member, as it is when the group plans)
                kv = (g.total if n == len(g.bases) else sum(g.bases[:n])) + n * out.group_at
                if not entries:  # the group's step: only its sizes
                    plan = StepPlan(n, kv, 0, n)
                    out.plan = plan
                    return plan
                if (len(entries) == 1 and self.prefill_plans_by_aggregates
                        and (entries[0][2] == 0 or entries[0][1] == 1)):
                    # and one request with one token or a prompt from its start
                    decode = out.num_decode
                    plan = StepPlan(n + 1, kv + entries[0][2], out.num_tokens - decode, decode)
                    out.plan = plan
                    return plan
            pairs = g.pairs[:n]
            contexts = list(map(add, g.bases[:n], repeat(out.group_at, n)))
            if entries:
                pairs += map(_pair, entries)
                contexts += map(_start, entries)
        elif self.plans_by_sizes:  # nobody reads the list: the same sizes without it
            decode = out.num_decode
            plan = StepPlan(len(entries), sum(map(_start, entries)), out.num_tokens - decode,
                            decode)
            out.plan = plan
            return plan
        else:
            pairs = list(map(_pair, entries))
            contexts = list(map(_start, entries))
        decode = out.num_decode
        plan = StepPlan(len(pairs), sum(contexts), out.num_tokens - decode, decode, pairs,
                        contexts)
        plan.num_singles = n  # the members decode one token each
        out.plan = plan
        return plan


_pair = itemgetter(0, 1)  # an entry's (request, tokens)
_start = itemgetter(2)  # an entry's computed tokens before the step
