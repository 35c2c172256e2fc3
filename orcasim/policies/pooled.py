"""How a :class:`~orcasim.policies.common.BatchPolicy` plans a step and completes a run.

A plan carries what a run needs (:meth:`PooledPlans.steps_left`, noted in
the pass that counts the plan's tokens) and counts the members of the
policy's :class:`~orcasim.policies.decode_pool.DecodePool` by its aggregates;
its per-request contexts are listed only if a latency model reads them. A
run's end advances the pool in one go
(:meth:`PooledPlans.complete_run`).
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter
from typing import Any

from orcasim.plan import StepPlan
from orcasim.policies.base import TokenPolicy
from orcasim.policies.decode_pool import DecodePool
from orcasim.policies.runs import TokenRuns
from orcasim.request import Request


class PooledPlans:
    """Plans and runs of a token policy with a decode pool (mixed into ``BatchPolicy``)."""

    ctx: Any
    running: list[Request]
    decoding: Any
    mem: Any
    pool: DecodePool | None
    _decodes: tuple[list[tuple[Request, int]], int, int, int] | None
    _left: tuple[StepPlan | None, int]
    _pooled: tuple[StepPlan | None, int, list[tuple[Request, int]]]

    def make_plan(self, scheduled: list[tuple[Request, int]]) -> StepPlan:
        """:meth:`TokenPolicy.make_plan`, noting in the same pass :meth:`steps_left` (for runs).

        The pool's members, all scheduled or none, count by its aggregates; the
        plan's contexts are listed only if a latency model reads them.
        """
        kv = prefill = decode = m = 0
        left = 1 << 62
        hint = self._decodes
        self._decodes = None
        pool = self.pool
        rest = scheduled
        if hint is not None and hint[0] is scheduled:  # its first m entries decode
            _, m, kv, left = hint
            decode = m
            rest = scheduled[m:]
        elif pool is not None and pool.size:
            m, rest = pool.members_of(scheduled)
            if m == pool.size:
                decode, kv, left = m, pool.kv, pool.first_finish()
            elif m:  # some members wait this step: the plain way
                pool.clear()
                m, rest = 0, scheduled
        kv, prefill, decode, left = tally(rest, kv, prefill, decode, left)
        if pool is not None and m:
            contexts: Any = partial(pool_contexts, pool, scheduled)
        else:
            contexts = partial(plain_contexts, scheduled)
        plan = StepPlan(len(scheduled), kv, prefill, decode, scheduled, contexts)
        self._left = (plan, left)
        self._pooled = (plan, m, rest)
        return plan

    def steps_left(self, plan: StepPlan) -> int:
        noted, left = self._left
        return left if noted is plan else TokenRuns.steps_left(self, plan)  # type: ignore[arg-type]

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """:meth:`~orcasim.policies.runs.TokenRuns.complete_run` with the pool: the ``m``
        entries of ``plan`` that are its members (all of them) advance together in O(1), the
        other entries one by one, after which they join it; those that finish leave it. The
        same effects as the plain pass.
        """
        pool = self.pool
        if pool is None:
            return super().complete_run(plan, ends)  # type: ignore[misc]
        noted, m, rest = self._pooled
        if noted is not plan:  # (not planned here: every entry at face value)
            pool.clear()
            m, rest = 0, plan.scheduled or []
        ctx = self.ctx
        k = len(ends)
        prev_end = ctx.last_step_end
        t1, t_end = ends[0], ends[-1]
        bulk = 0
        own = True  # whether the loop below records the others' inter-token gaps
        if m:
            if pool.last == prev_end:
                bulk = m
            else:  # every member's gap is the same (their last tokens came with the pool's)
                record_itl = ctx.recorder.record_itl
                gap = t1 - pool.last  # type: ignore[operator]
                for r, _ in rest:  # (any other request with a gap of its own?)
                    if r.num_output_tokens and r.last_token != prev_end:
                        own = False  # both kinds: recorded in the step's order
                        break
                if not own:
                    for r, _ in plan.scheduled or ():
                        if r in pool:
                            record_itl(gap)
                        elif r.num_output_tokens and r.last_token != prev_end:
                            record_itl(t1 - r.last_token)  # type: ignore[operator]
                else:
                    ctx.recorder.record_itl_each(gap, m)
        more = k - 1
        joining: list[Request] = []
        finished: list[Request] = []
        for req, n in rest:
            out = req.num_output_tokens
            if out == 0:
                req.first_token = t1
            elif req.last_token == prev_end:
                bulk += 1
            elif own:
                ctx.recorder.record_itl(t1 - req.last_token)  # type: ignore[operator]
            out += k
            if out < req.output_len:
                req.num_computed_tokens += n + more
                req.num_output_tokens = out
                req.last_token = t_end
                joining.append(req)
            else:  # it finishes in the last step: leave it as that step finds it
                req.num_computed_tokens += n + more - 1
                req.num_output_tokens = out - 1
                req.last_token = ends[-2] if k > 1 else prev_end
                finished.append(req)
        plan.num_itl_tokens = bulk
        # the members that finish (up to date), and the steps until the next one does
        done, left = pool.end_run(k, t_end, joining)
        running = self.running
        if len(finished) + len(done) == 1:  # one finishes: as finish_run, with no order to find
            if finished:
                req = finished[0]
                req.num_computed_tokens += 1
                req.num_output_tokens += 1
                req.last_token = t_end
            else:
                req = done[0]
            running.remove(req)
            if self.mem is not None or type(self).release is not TokenPolicy.release:
                self.release(req)  # type: ignore[attr-defined]  # (else: nothing to free)
            ctx.finish_one(req, t_end)
        elif finished or done:
            before_last = ends[-2] if k > 1 else prev_end
            for req in done:  # as the last step finds them
                req.num_computed_tokens -= 1
                req.num_output_tokens -= 1
                req.last_token = before_last
                finished.append(req)
            if k > 1:
                finished = self.last_step_order(finished)  # type: ignore[attr-defined]
            else:  # the order of the plan
                finished.sort(key=list(map(itemgetter(0), plan.scheduled or ())).index)
            self.finish_run(finished, t_end)  # type: ignore[attr-defined]
        self.decoding = (running, len(running), pool.kv, left)  # (finishing leaves the pool be)

def plain_contexts(scheduled: list[tuple[Request, int]]) -> list[int]:
    """The computed tokens of ``scheduled``'s requests."""
    return [r.num_computed_tokens for r, _ in scheduled]


def pool_contexts(pool: DecodePool, scheduled: list[tuple[Request, int]]) -> list[int]:
    """The computed tokens of ``scheduled``'s requests, members of ``pool`` or not."""
    context = pool.context
    return [context(r) for r, _ in scheduled]


def tally(rest: list[tuple[Request, int]], kv: int, prefill: int, decode: int, left: int
          ) -> tuple[int, int, int, int]:
    """Add the entries ``rest`` (outside the decode pool) to a plan's counts: KV tokens
    computed, prefill tokens and decoding sequences, and the steps left before one of them
    finishes or leaves its prefill (0 when a prompt stays partial)."""
    for req, n in rest:
        c = req.num_computed_tokens
        kv += c
        out = req.num_output_tokens
        known = (req.prompt_len or 1) + out
        if n == 1 and out > 0 and c == known - 1:
            decode += 1
        else:
            prefill += n
            if c + n < known:
                left = 0
        if req.output_len - out < left:
            left = req.output_len - out
    return kv, prefill, decode, left
