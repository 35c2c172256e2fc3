"""The policy interface, and the shared core of decode-only batching policies.

A policy decides, at every step boundary, which requests run in the next
step. The engine runs its :meth:`Policy.next_step` generator inside the engine
process: the generator may ``yield`` SimPy events to wait (``yield
ctx.arrival``) and ``return`` a :class:`~orcasim.plan.StepPlan`, or ``None``
when no work remains and none will arrive. After the step the engine calls
:meth:`Policy.complete_step`, where the policy applies its effects (tokens
emitted, requests finished) through the context.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any, ClassVar

import simpy

from orcasim.batch import DecodeBatch
from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.request import Request, RequestState


class PolicyParams(ComponentParams):
    """Base for a policy's scenario parameters."""


class Policy:
    """A scheduling policy for one engine."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = PolicyParams

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        self.params = params
        self.ctx = ctx

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        """Wait as needed, then return the next step's plan (``None``: no more work)."""
        raise NotImplementedError

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

    def summary_metrics(self) -> dict[str, float]:
        """Policy-specific metrics added to the run's summary (e.g. prefix-cache hits)."""
        return {}

    def batch_labels(self, plan: StepPlan) -> tuple[str | None, ...]:
        """Labels of the requests in ``plan`` by slot, ``None`` for an empty slot (for tables)."""
        if plan.scheduled is None:
            return tuple(r.label for r in self.running_requests())
        return tuple(r.label for r, _ in plan.scheduled)


class DecodeOnlyPolicy(Policy):
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

    def admit(self) -> None:
        """Move waiting requests into the batch (via :meth:`join`) as the policy allows."""
        raise NotImplementedError

    def join(self, req: Request) -> None:
        """Put ``req`` into the batch for the next step."""
        self.ctx.admit(req)
        self.batch.add(req)
        self._joined.append(req)

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        ctx = self.ctx
        batch = self.batch
        while True:
            ctx.poll_arrivals()
            if ctx.waiting:
                self.admit()
            if batch.size:
                joined = self._joined
                if self.prefill and joined:
                    fresh = sum(r.prompt_len + r.num_output_tokens for r in joined)
                    return StepPlan(batch.size, batch.num_kv_tokens - fresh, fresh,
                                    batch.size - len(joined))
                return StepPlan(batch.size, batch.num_kv_tokens)
            if not ctx.waiting and ctx.arrivals_done:
                return None
            yield ctx.arrival

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        joined = self._joined
        finished = self.batch.advance()
        if joined:
            for req in joined:
                if req.first_token is None:
                    req.first_token = t_end
            plan.num_itl_tokens = plan.num_seqs - len(joined)
            self._joined = []
        else:
            plan.num_itl_tokens = plan.num_seqs
        if finished:
            finish = self.ctx.finish
            for req in finished:
                finish(req, t_end)

    def running_requests(self) -> Iterable[Request]:
        return iter(self.batch)

    def drop(self, req: Request) -> None:
        self.batch.remove(req)
        if req in self._joined:
            self._joined.remove(req)

    def batch_labels(self, plan: StepPlan) -> tuple[str | None, ...]:
        return tuple(None if r is None else r.label for r in self.batch.slot_view())


class TokenPolicy(Policy):
    """Policies that give each scheduled request a number of tokens per step (vLLM's rule).

    A request's *known* tokens (``req.num_tokens``) are its prompt plus the
    tokens it has generated.
    Each step a scheduled request computes ``n`` more of them
    (``num_computed_tokens += n``); a step that brings it level with its known
    tokens samples one new token. So a prefill can be split into chunks, a
    prefix-cache hit starts ``num_computed_tokens`` above zero, and a request
    preempted by recompute starts again from zero and emits its next token once
    it has recomputed prompt and generated tokens. Decoding is ``n = 1``.

    Subclasses keep ``self.running`` (the batch, in the order they schedule it)
    and implement :meth:`next_step`, building the plan with :meth:`make_plan`.
    Finished requests are removed from ``self.running`` and passed to
    :meth:`release` (free their memory there) before they are recorded.
    """

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.running: list[Request] = []

    def make_plan(self, scheduled: list[tuple[Request, int]]) -> StepPlan:
        """A plan running ``scheduled`` ``(request, num_tokens)`` pairs, with its cost aggregates.

        Decode tokens are single tokens that compute a request's newest
        generated token; every other scheduled token counts as prefill. KV
        tokens are the tokens already computed (the context the step reads).
        """
        kv = prefill = decode = 0
        for req, n in scheduled:
            c = req.num_computed_tokens
            kv += c
            if n == 1 and req.num_output_tokens > 0 and c == req.num_tokens - 1:
                decode += 1
            else:
                prefill += n
        return StepPlan(len(scheduled), kv, prefill, decode, scheduled)

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        ctx = self.ctx
        prev_end = ctx.last_step_end
        record_itl = ctx.recorder.record_itl
        bulk = 0
        finished: list[Request] = []
        for req, n in plan.scheduled or ():
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
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for req in finished:
                self.release(req)
                ctx.finish(req, t_end)

    def release(self, req: Request) -> None:
        """Hook: ``req`` left the batch (finished, preempted, dropped): free its KV blocks here."""

    def running_requests(self) -> Iterable[Request]:
        return iter(self.running)

    def drop(self, req: Request) -> None:
        self.running.remove(req)
        self.release(req)

    def preempt(self, req: Request) -> None:
        """Preempt running ``req`` by recompute and put it back at the head of ``ctx.waiting``.

        It keeps the tokens it generated; it loses its computed KV, so when it
        runs again it recomputes prompt and generated tokens before emitting
        its next token.
        """
        self.drop(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.state = RequestState.PREEMPTED
        self.ctx.waiting.appendleft(req)
