"""The plan of a token-level policy right after a run, made in the token loop.

:class:`~orcasim.policies.token_loop.TokenRunLoop` plans a boundary right
after a run itself when the policy follows the plain step rule
(:meth:`AfterRun._after_run`): the running requests' decode entries, the
admissions and the plan from what the run noted, with the effects of
``BatchPolicy.ready_plan``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from orcasim.backlog import Backlog
from orcasim.plan import StepPlan
from orcasim.policies.pooled import pool_contexts, tally
from orcasim.request import Request, RequestState

RUNNING = RequestState.RUNNING


class AfterRun:
    """:meth:`_after_run` of :class:`~orcasim.policies.token_loop.TokenRunLoop` (mixed in)."""

    policy: Any
    ctx: Any
    env: Any
    #: the backlog when the policy admits from it by ``admit_from_backlog`` with nothing to
    #: call per admission (then :meth:`_after_run` admits its new rows inline), or None
    _lean: Backlog | None
    #: whether the policy's ``planned`` hook does something
    _hook: bool
    #: whether the policy's decode entries right after a run are the kept ones of a keyed
    #: policy, as defined (then :meth:`_after_run` copies them in place when they are at
    #: hand): 1 ``KeyedPolicy.decode_entries``, 2 ``SRPT.decode_entries`` with the true
    #: lengths (which also notes that the kept order was sorted now), 0 neither
    _kept: int

    def _after_run(self) -> StepPlan | None:
        """``BatchPolicy.ready_plan`` at a boundary right after a run, when every running
        request decodes (the policy's ``decoding`` says so): the arrivals due, the running
        requests' decode entries, the admissions (``admit_waiting``), and the plan from the
        run's notes (``PooledPlans.make_plan``), with the same effects. ``None`` (having done
        no more than take the arrivals due): not such a boundary."""
        policy = self.policy
        running = policy.running
        decoding = policy.decoding
        if decoding is None or decoding[0] is not running:
            return None
        p = decoding[1]
        budget = policy._budget
        if not 0 < p == len(running) <= budget:
            return None
        src: Any = self.ctx.source  # (ctx.poll_arrivals)
        now = self.env._now
        i = src._next
        if i < src._n and src._arrival[i] <= now:
            src.flush(now)
        policy._preempted_for_memory = False  # (BatchPolicy.schedule, schedule_running)
        pool = policy.pool
        if policy._fifo:
            scheduled = pool.entries.copy()
        elif (self._kept and (entries := policy._entries) is not None
              and policy._entries_of is (ordered := policy._ordered) and ordered is not None
              and len(entries) == len(ordered) == p):
            if self._kept == 2:  # (SRPT.decode_entries: the kept order holds after the run)
                policy._sorted_at = now
            scheduled = entries.copy()  # (KeyedPolicy.decode_entries: the kept order's)
        else:
            scheduled = policy.decode_entries()
        policy.decoding = None
        kv, left = decoding[2], decoding[3]
        ctx = self.ctx
        lean = self._lean
        slots = ctx.slots
        if (lean is not None and ctx.waiting is lean and not lean._head and not slots.reserved
                and ctx.on_admit is None and ctx._admitted is None):
            # admit_from_backlog on new rows only, with ctx.admit and tally for each inline
            policy._decodes = None
            rest: list[tuple[Any, int]] = []
            budget -= p
            prefill = 0
            i, hi = lean._lo, lean._hi
            count, cap = slots.count, slots.capacity
            if budget > 0 and count < cap and i < hi:
                make, prompt, arrival = src._request, src._prompt, src._arrival
                output = None if src._attrs else src._output  # (else: make sets the attributes)
                busy_until = ctx.busy_until
                start = now if busy_until <= now else busy_until
                chunked = policy.chunked
                k = i
                while True:
                    known = prompt[k] or 1
                    need = known if known <= budget else budget if chunked else 0
                    req = (make(k, arrival[k]) if output is None  # (OpenLoopSource._request)
                           else Request(k, arrival[k], prompt[k], output[k]))
                    k += 1
                    if not need:  # head-of-line: it waits, a request at the queue's head
                        lean._head.append(req)
                        break
                    req.state = RUNNING
                    req.first_scheduled = start
                    running.append(req)
                    entry = (req, need)
                    scheduled.append(entry)
                    rest.append(entry)
                    budget -= need
                    prefill += need
                    if need < known:
                        left = 0
                    if req.output_len < left:
                        left = req.output_len
                    count += 1
                    if not (budget > 0 and count < cap and k < hi):
                        break
                lean._lo = k
                ctx.num_started += len(rest)
                slots.count = count
            decode = p
        else:
            policy._decodes = hint = (scheduled, p, kv, left)
            policy.admit_waiting(scheduled, budget - p)
            if policy._decodes is not hint:  # (a preemption changed the batch)
                if not scheduled:
                    return None  # (as ready_plan: the engine's next_step schedules again)
                return policy.planned(policy.make_plan(scheduled))  # type: ignore[no-any-return]
            policy._decodes = None  # (PooledPlans.make_plan from the notes: p entries decode)
            rest = scheduled[p:]
            kv, prefill, decode, left = tally(rest, kv, 0, p, left)
        plan = StepPlan(len(scheduled), kv, prefill, decode, scheduled,
                        partial(pool_contexts, pool, scheduled))
        policy._left = (plan, left)
        policy._pooled = (plan, p, rest)
        return policy.planned(plan) if self._hook else plan  # type: ignore[no-any-return]
