"""``prefill-first``: new prompts run alone and decodes wait (vLLM V0's default scheduler).

When waiting requests can be admitted (room in the batch, whole prompts
within the token budget, first come first served), the step computes only
their prompts, which emits their first tokens; the running requests' decodes
wait for that step. Otherwise every running request decodes one token. New
requests get a short TTFT; running ones see a long inter-token gap whenever
prompts arrive. A prompt larger than the token budget is rejected
(``prompt_too_long``).
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from pydantic import Field

from orcasim.backlog import Backlog
from orcasim.plan import StepPlan
from orcasim.policies.backlog_admit import admit_from_backlog
from orcasim.policies.base import slots_field
from orcasim.policies.common import BatchPolicy, MemoryParams
from orcasim.policies.pooled import plain_contexts, pool_contexts, tally
from orcasim.registry import policies
from orcasim.request import Request
from orcasim.source import OpenLoopSource

#: the step rule's running requests' tokens, as defined (a subclass, or a test, that replaces
#: it schedules them its own way: then the decode plan is made through it)
PLAIN_SCHEDULE_RUNNING = BatchPolicy.schedule_running


@policies.register("prefill-first")
class PrefillFirst(BatchPolicy):
    """Prompt-only steps whenever a new request can be admitted; decode steps otherwise."""

    runs_unchanged = True
    #: off: :meth:`ready_plan` is the general one (``schedule``, then ``make_plan``)
    lean_plan: ClassVar[bool] = True

    class Params(MemoryParams):
        max_batch: int = slots_field(32)
        token_budget: int = Field(2048, gt=0, description="prompt tokens per prefill step at most")

    def schedule(self) -> list[tuple[Request, int]]:
        scheduled: list[tuple[Request, int]] = []
        if self.ctx.waiting:
            self.admit_waiting(scheduled, self.params.token_budget)
            if scheduled:
                return scheduled
        return self.schedule_running(self.decode_budget())[0]

    def decode_budget(self) -> int:
        return 1 << 62  # decode steps are not limited by the (prompt) token budget

    def ready_plan(self) -> StepPlan | None:  # type: ignore[override]
        """:meth:`BatchPolicy.ready_plan` with this policy's :meth:`schedule`, a prompt-only
        step planned at once: its requests, just admitted, are none of the decode pool's
        members, so :meth:`make_plan` would count each of them (``tally``)."""
        lean = self._lean
        if lean is None:  # (the class's methods and switches, read at the first boundary)
            lean = self._lean = self._lean_steps()
        if not lean[0]:
            return super().ready_plan()
        ctx = self.ctx
        src = ctx.source
        if type(src) is OpenLoopSource:  # (ctx.poll_arrivals)
            now = ctx.env._now
            i = src._next
            if i < src._n and src._arrival[i] <= now:
                src.flush(now)
        elif src is not None:
            now = ctx.env._now
            if src.pending_until(now):
                src.flush(now)
        waiting = ctx.waiting
        slots = ctx.slots
        preemptive = self.preemptive
        # (admit_waiting admits nothing into a full batch unless it preempts)
        if slots.count < slots.capacity or preemptive:
            scheduled: list[tuple[Request, int]] = []
            if type(waiting) is Backlog and not preemptive and lean[1]:  # (its steps)
                admit_from_backlog(self, waiting, scheduled, self.params.token_budget, lean[2])
            elif waiting:
                self.admit_waiting(scheduled, self.params.token_budget)
            if scheduled:  # (PooledPlans.make_plan, with no member of the pool among them)
                self._decodes = None
                kv, prefill, decode, left = tally(scheduled, 0, 0, 0, 1 << 62)
                plan = StepPlan(len(scheduled), kv, prefill, decode, scheduled,
                                partial(plain_contexts, scheduled))
                self._left = (plan, left)
                self._pooled = (plan, 0, scheduled)
                return self.planned(plan) if lean[3] else plan
        pool = self.pool
        if self.decoding is None and pool is not None and pool.size and lean[4]:
            # (schedule_running and make_plan: the pool's members decode, then each other
            # running request computes what it misses, within a budget it cannot reach)
            p = pool.size
            scheduled = pool.entries.copy()
            rest = [(r, (r.prompt_len or 1) + r.num_output_tokens - r.num_computed_tokens)
                    for r in self.running[p:]]
            scheduled += rest
            self._decodes = None
            kv, prefill, decode, left = tally(rest, pool.kv, 0, p, pool.first_finish())
            plan = StepPlan(len(scheduled), kv, prefill, decode, scheduled,
                            partial(pool_contexts, pool, scheduled))
            self._left = (plan, left)
            self._pooled = (plan, p, rest)
            return self.planned(plan) if lean[3] else plan
        scheduled = self.schedule_running(1 << 62)[0]
        return self.planned(self.make_plan(scheduled)) if scheduled else None

    #: :meth:`ready_plan`'s ways, found at its first call (see :meth:`_lean_steps`)
    _lean: tuple[bool, bool, bool, bool, bool] | None = None

    def _lean_steps(self) -> tuple[bool, bool, bool, bool, bool]:
        """Whether :meth:`ready_plan` takes its own steps at all; admits from a backlog
        directly (``admit_from_backlog``); calls ``admitted``; calls ``planned``; plans a
        decode step from the pool."""
        kind = type(self)
        own = (self.lean_plan and self.mem is None and kind.schedule is PrefillFirst.schedule
               and kind.make_plan is BatchPolicy.make_plan
               and kind.decode_budget is PrefillFirst.decode_budget)
        return (own, self.lean_backlog and kind.admit_waiting is BatchPolicy.admit_waiting,
                kind.admitted is not BatchPolicy.admitted,
                kind.planned is not BatchPolicy.planned,
                self._fifo and kind.schedule_running is PLAIN_SCHEDULE_RUNNING)
