"""The policy interface, and the shared core of decode-only batching policies.

A policy changes the batch; the engine runs steps over it. Two styles, both
first-class and freely mixed:

- *step-synchronous*: at every step boundary the engine runs the policy's
  :meth:`Policy.next_step` generator, which decides the whole next step and
  returns its :class:`~orcasim.plan.StepPlan` (``None`` when no work
  remains and none will arrive). It may ``yield`` any SimPy event to wait
  (``yield ctx.slot_freed``, ``yield ctx.kv.freed``, ``yield ctx.step_end``,
  a timer). While it waits, the engine keeps running the batch as it is
  (:meth:`Policy.continue_step`), and resumes the generator at the first step
  boundary after the event; with nothing running, the engine waits with it.
- *event-driven*: :meth:`Policy.processes` returns generators that the
  engine starts as SimPy processes; they wait on arrivals, freed slots and
  memory, and admit requests (``ctx.admit``) whenever they like. A request
  admitted while a step is in flight runs from the next step.

After each step the engine calls :meth:`Policy.complete_step`, where the
policy applies its effects (tokens emitted, requests finished) through the
context.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, ClassVar

import simpy

from orcasim.batch import DecodeBatch
from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.policy_params import PolicyParams as PolicyParams
from orcasim.policies.policy_params import slot_capacity
from orcasim.policies.policy_params import slots_field as slots_field
from orcasim.policies.runs import DecodeRuns, TokenRuns
from orcasim.request import Request, RequestState

RUNNING = RequestState.RUNNING


class Policy:
    """A scheduling policy for one engine."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = PolicyParams

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        self.params = params
        self.ctx = ctx
        if ctx is not None:
            ctx.slots.capacity = cap = slot_capacity(params) or ctx.slots.capacity
            ctx.slots.limited = cap < (1 << 62)

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        """Wait as needed, then return the next step's plan (``None``: no more work)."""
        raise NotImplementedError

    #: whether the engine may run unchanged decode steps in one event (see ``decode_run``);
    #: such a policy also polls arrivals at every boundary and waits only on ``ctx.arrival``
    #: (or :meth:`SchedulerContext.wake_event`), so its source may release them lazily
    _runs: bool = False

    #: optional fast path: ``() -> StepPlan | None``, the next plan when one is ready without
    #: waiting (``None``: ask :meth:`next_step`); saves a generator per step in hot loops
    ready_plan: Callable[[], StepPlan | None] | None = None

    def continue_step(self) -> StepPlan | None:
        """The next step of the running batch as it is, with no admission (``None``: nothing).

        The engine runs it while :meth:`next_step` waits on an event.
        """
        return None

    def processes(self) -> list[Generator[simpy.Event, Any, Any]]:
        """Event-driven parts of the policy, started by the engine as SimPy processes."""
        return []

    @property
    def event_driven(self) -> bool:
        """True if the policy has processes, which may admit requests at any time."""
        return type(self).processes is not Policy.processes

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        """Apply the effects of ``plan``, which ran from ``t_start`` to ``t_end``.

        Must set ``plan.num_itl_tokens``: the tokens emitted by sequences that
        also emitted in the previous step.
        """
        raise NotImplementedError

    def running_requests(self) -> Iterable[Request]:
        """Requests currently holding a place in the batch."""
        raise NotImplementedError

    def drop(self, req: Request) -> None:
        """Take running ``req`` out of the batch (before an abort); free what it holds."""
        raise NotImplementedError

    def cancel(self, req: Request) -> None:
        """Take ``req`` out wherever it is, freeing its slot and memory (it is then aborted).

        The default: out of ``ctx.waiting`` if it is queued, else :meth:`drop`.
        """
        try:
            self.ctx.waiting.remove(req)
        except ValueError:
            self.drop(req)

    def summary_metrics(self) -> dict[str, float]:
        """Policy-specific metrics added to the run's summary (e.g. prefix-cache hits)."""
        return {}

    def batch_labels(self, plan: StepPlan) -> tuple[str | None, ...]:
        """Labels of the requests in ``plan`` by slot, ``None`` for an empty slot (for tables)."""
        if plan.scheduled is None:
            return tuple(r.label for r in self.running_requests())
        return tuple(r.label for r, _ in plan.scheduled)


class DecodeOnlyPolicy(Policy, DecodeRuns):
    """Iteration-level decoding with prompts already cached (the seed notebook's model).

    Every running request emits one token per step; a step reads the KV
    tokens (prompt + generated) of the batch. Subclasses decide only *when*
    waiting requests join the batch, in :meth:`admit`.

    With ``prefill: true`` in the policy's parameters, a request's first step
    also computes its prompt (Orca runs a prompt in the request's first
    iteration, which emits the first token): the plan then charges those
    tokens as prefill instead of as KV reads. Off, prompts cost only their KV
    reads, as in the seed notebook.
    """

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.batch = DecodeBatch()
        self.prefill: bool = bool(getattr(params, "prefill", False))
        self._joined: list[Request] = []
        self._deferred: list[Request] = []  # admitted during a step in flight
        self._listens = self.event_driven  # its processes may admit at any time
        self._runs = self.runs_unchanged

    def admit(self) -> None:
        """Move waiting requests into the batch (via :meth:`join`) as the policy allows."""
        raise NotImplementedError

    def join_fcfs(self, room: int) -> None:
        """:meth:`join` the first ``room`` waiting requests (or all, if fewer wait)."""
        if room <= 0:
            return
        waiting = self.ctx.waiting
        n = min(room, len(waiting))
        if n == 1:  # the usual case: one finished, the next one joins
            self.join(waiting.popleft())
        elif n > 1:
            join = self.join
            popleft = waiting.popleft
            for _ in range(n):
                join(popleft())

    def join(self, req: Request) -> None:
        """Put ``req`` into the batch for the next step.

        While a step is in flight (an event-driven process admitting), the
        request waits beside the batch until that step ends.
        """
        ctx = self.ctx
        ctx.admit(req)
        if ctx.busy_until > ctx.env._now:
            self._deferred.append(req)
            return
        self.batch.add(req)
        self._joined.append(req)

    def _take_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for req in deferred:
            self.batch.add(req)
            self._joined.append(req)

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        ctx = self.ctx
        while True:
            plan = DecodeOnlyPolicy.ready_plan(self)
            if plan is not None:
                return plan
            if not ctx.waiting and ctx.arrivals_done:
                return None
            yield ctx.arrival | ctx.admitted if self._listens else ctx.arrival

    def ready_plan(self) -> StepPlan | None:  # type: ignore[override]
        """:meth:`next_step` without the wait: the plan if the batch is not empty, else None."""
        if self._deferred:
            self._take_deferred()
        ctx = self.ctx
        ctx.poll_arrivals()
        if ctx.waiting:
            self.admit()
        batch = self.batch
        if batch.size:
            if self.prefill and self._joined:
                return self._batch_plan()
            return StepPlan(batch.size, batch.num_kv_tokens)
        return None

    def continue_step(self) -> StepPlan | None:
        if self._deferred:
            self._take_deferred()
        return self._batch_plan() if self.batch.size else None

    def _batch_plan(self) -> StepPlan:
        """The step of the batch as it is (its joiners' prompts as prefill with ``prefill``)."""
        batch = self.batch
        joined = self._joined
        if self.prefill and joined:
            fresh = sum(r.prompt_len + r.num_output_tokens for r in joined)
            return StepPlan(batch.size, batch.num_kv_tokens - fresh, fresh,
                            batch.size - len(joined))
        return StepPlan(batch.size, batch.num_kv_tokens)

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        """Every member emits a token: first tokens, ITL (a resumed request's own gap), ends."""
        self._complete(plan, t_end, t_end)

    def _complete(self, plan: StepPlan, t_first: float, t_end: float, k: int = 1) -> None:
        """The effects of ``plan``'s step (ending at ``t_first``) and of the batch's ``k - 1``
        steps after it, in which nobody finishes before the last (ending at ``t_end``)."""
        joined = self._joined
        finished = self.batch.advance(k)
        if joined:
            for req in joined:
                if req.first_token is None:
                    req.first_token = t_first
                else:  # resumed after a preemption: its own gap
                    self.ctx.recorder.record_itl(t_first - req.last_token)  # type: ignore[operator]
            plan.num_itl_tokens = plan.num_seqs - len(joined)
            self._joined = []
        else:
            plan.num_itl_tokens = plan.num_seqs
        if finished:
            self.finished(finished, t_end)

    def finished(self, reqs: list[Request], t_end: float) -> None:
        """``reqs`` emitted their last token at ``t_end`` and left the batch."""
        self.ctx.finish_all(reqs, t_end)

    def running_requests(self) -> Iterable[Request]:
        if self._deferred:
            return iter([*self.batch, *self._deferred])
        return iter(self.batch)

    def drop(self, req: Request) -> None:
        if req in self._deferred:
            self._deferred.remove(req)
            return
        self.batch.remove(req)
        if req in self._joined:
            self._joined.remove(req)

    def batch_labels(self, plan: StepPlan) -> tuple[str | None, ...]:
        return tuple(None if r is None else r.label for r in self.batch.slot_view())


class TokenPolicy(Policy, TokenRuns):
    """Policies that give each scheduled request a number of tokens per step (vLLM's rule).

    A request's *known* tokens (``req.num_tokens``) are its prompt plus the
    tokens it has generated.
    Each step a scheduled request computes ``n`` more of them
    (``num_computed_tokens += n``); a step that brings it level with its known
    tokens samples one new token. So a prefill can be split into chunks, a
    prefix-cache hit starts ``num_computed_tokens`` above zero, and a request
    preempted by recompute starts again from zero and emits its next token once
    it has recomputed prompt and generated tokens. Decoding is ``n = 1``.

    Subclasses keep ``self.running`` (the batch, in the order they schedule it).
    A step-synchronous subclass implements :meth:`next_step`, building the plan
    with :meth:`make_plan`; an event-driven one only admits from its
    :meth:`~Policy.processes` (``ctx.admit(req)``, then
    ``self.running.append(req)``), and the default :meth:`next_step` runs every
    running request's missing tokens each step. Finished requests are removed
    from ``self.running`` and passed to :meth:`release` (which frees their KV
    memory) before they are recorded.
    """

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.running: list[Request] = []
        #: runs offered: the class says so and keeps the plain step rule and effects
        self._runs = self.runs_unchanged and type(self).complete_step is TokenPolicy.complete_step

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        """Run the batch as it is; with nothing running, wait for an arrival or an admission."""
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            plan = self.continue_step()
            if plan is not None:
                return plan
            if not ctx.waiting and not self.running and ctx.arrivals_done:
                return None
            yield ctx.arrival | ctx.admitted

    def continue_step(self) -> StepPlan | None:
        """Every running request computes the tokens it is missing (no budget, no admission)."""
        scheduled = [(r, r.num_tokens - r.num_computed_tokens) for r in self.running]
        return self.make_plan(scheduled) if scheduled else None

    def make_plan(self, scheduled: list[tuple[Request, int]]) -> StepPlan:
        """A plan running ``scheduled`` ``(request, num_tokens)`` pairs, with its cost aggregates.

        Decode tokens are single tokens that compute a request's newest
        generated token; every other scheduled token counts as prefill. KV
        tokens are the tokens already computed (the context the step reads).
        """
        kv = prefill = decode = 0
        contexts = []
        for req, n in scheduled:
            c = req.num_computed_tokens
            kv += c
            contexts.append(c)
            if n == 1 and req.num_output_tokens > 0 and c == req.num_tokens - 1:
                decode += 1
            else:
                prefill += n
        return StepPlan(len(scheduled), kv, prefill, decode, scheduled, contexts)

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        ctx = self.ctx
        prev_end = ctx.last_step_end
        record_itl = ctx.recorder.record_itl
        bulk = 0
        finished: list[Request] = []
        for req, n in plan.scheduled or ():
            if req.state != RUNNING:
                continue  # preempted or aborted while the step ran: its part is lost
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens:
                if req.num_output_tokens == 0:
                    req.first_token = t_end
                elif req.last_token == prev_end:
                    bulk += 1
                else:
                    record_itl(t_end - req.last_token)  # type: ignore[operator]
                req.num_output_tokens += 1
                req.last_token = t_end
                if req.num_output_tokens >= req.output_len:
                    finished.append(req)
        plan.num_itl_tokens = bulk
        if finished:
            self.finish_step(finished, t_end)

    def finish_step(self, finished: list[Request], t_end: float) -> None:
        """The requests of a step ending at ``t_end`` that emitted their last token leave the
        batch and finish, in ``finished``'s order (:meth:`complete_step`'s end)."""
        ctx = self.ctx
        done = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in done]
        for req in finished:
            self.release(req)
            ctx.finish(req, t_end)

    def release(self, req: Request) -> None:
        """``req`` left the batch (finished, preempted, dropped): free its KV memory."""
        kv = self.ctx.kv
        if kv.limited and kv.holds(req):
            kv.release(req)

    def running_requests(self) -> Iterable[Request]:
        return iter(self.running)

    def drop(self, req: Request) -> None:
        self.running.remove(req)
        self.release(req)

    def preempt(self, req: Request, reason: str = "priority") -> None:
        """Preempt running ``req`` by recompute and put it back at the head of ``ctx.waiting``.

        It keeps the tokens it generated; it loses its computed KV, so when it
        runs again it recomputes prompt and generated tokens before emitting
        its next token. ``reason`` is counted in the summary
        (``num_preemptions_<reason>``).
        """
        self.drop(req)
        ctx = self.ctx
        ctx.preempted(req, reason, recompute=req.num_computed_tokens)
        req.num_computed_tokens = 0
        ctx.waiting.appendleft(req)
