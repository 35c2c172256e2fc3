"""Shared core of the token-level policies: one step rule, with hooks for the order.

:class:`BatchPolicy` is iteration-level batching with a per-step token budget
(vLLM's ``max_num_batched_tokens``) and a cap on running sequences
(``max_num_seqs``). Each step:

1. running requests, in :meth:`~BatchPolicy.order_running` order, get the
   tokens they still need (the rest of a prompt, or one decode token), within
   the budget; with ``chunked_prefill`` a prompt that does not fit is split;
2. waiting requests are admitted from the head of ``ctx.waiting`` while the
   batch has room and budget is left (the queue's type sets the order: a
   policy installs a :class:`~orcasim.policies.queues.KeyedQueue` to serve by
   priority, deadline or length);
3. a preemptive policy, when the batch is full, preempts (by recompute) the
   running request :meth:`~BatchPolicy.victim` names, to make room for the head.

Without chunked prefill a prompt larger than the whole budget can never be
scheduled; it is rejected with reason ``prompt_too_long`` (vLLM does the same).

Also here: :class:`ClassLevels` (a request's priority level from its class)
and :class:`LengthPredictor` (true or noisy output lengths).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable
from typing import Any, ClassVar

import simpy
from pydantic import Field

from orcasim.context import SchedulerContext
from orcasim.errors import SimulationError
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.base import PolicyParams, TokenPolicy
from orcasim.policies.queues import KeyedQueue
from orcasim.request import Request


class TokenParams(PolicyParams):
    """Parameters every :class:`BatchPolicy` has."""

    max_batch: int = Field(32, gt=0, description="running sequences at most (max_num_seqs)")
    token_budget: int = Field(2048, gt=0, description="tokens computed per step at most")
    chunked_prefill: bool = Field(True, description="split a prompt across steps to fit the budget")


class BatchPolicy(TokenPolicy):
    """Mixed prefill/decode batching under a token budget; subclasses choose the order."""

    Params: ClassVar[type[ComponentParams]] = TokenParams
    #: whether :meth:`victim` is consulted when the batch is full
    preemptive: bool = False

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.chunked: bool = bool(getattr(params, "chunked_prefill", False))

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            scheduled = self.schedule()
            if scheduled:
                return self.make_plan(scheduled)
            if not ctx.waiting and not self.running and ctx.arrivals_done:
                return None
            yield ctx.wake_event()

    # -- hooks ---------------------------------------------------------------
    def order_running(self) -> Iterable[Request]:
        """The order in which running requests get tokens (default: admission order)."""
        return self.running

    def victim(self, head: Request) -> Request | None:
        """A running request to preempt so that ``head`` can run, or ``None``."""
        return None

    def admitted(self, req: Request) -> None:
        """Hook: ``req`` was just admitted from the waiting queue."""

    # -- the step rule ---------------------------------------------------------
    def schedule(self) -> list[tuple[Request, int]]:
        """This step's ``(request, tokens)``: running requests first, then admissions."""
        p = self.params
        budget: int = p.token_budget
        chunk = self.chunked
        scheduled: list[tuple[Request, int]] = []
        for req in self.order_running():
            if budget <= 0:
                break
            need = req.num_tokens - req.num_computed_tokens
            if need > budget:
                if chunk:
                    need = budget
                elif scheduled:
                    continue
            scheduled.append((req, need))
            budget -= need
        self.admit_waiting(scheduled, budget)
        return scheduled

    def admit_waiting(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        """Admit from the head of ``ctx.waiting`` into ``scheduled``; return the budget left."""
        ctx = self.ctx
        waiting = ctx.waiting
        running = self.running
        p = self.params
        while waiting and budget > 0:
            head = waiting[0]
            if len(running) >= p.max_batch:
                victim = self.victim(head) if self.preemptive else None
                if victim is None:
                    break
                budget += unschedule(scheduled, victim)
                self.preempt(victim)
                continue
            need = head.num_tokens - head.num_computed_tokens
            if need > budget:
                if self.chunked:
                    need = budget
                elif scheduled:
                    break  # head-of-line: it waits for a step with room
                elif head.num_output_tokens == 0 and need > p.token_budget:
                    waiting.popleft()
                    ctx.reject(head, "prompt_too_long")
                    continue
                # else: a preempted request's recompute runs alone, over the budget
            waiting.popleft()
            ctx.admit(head)
            running.append(head)
            scheduled.append((head, need))
            budget -= need
            self.admitted(head)
        return budget


def unschedule(scheduled: list[tuple[Request, int]], req: Request) -> int:
    """Remove ``req`` from ``scheduled``; return the tokens it had (0 if absent)."""
    for i, (r, n) in enumerate(scheduled):
        if r is req:
            del scheduled[i]
            return n
    return 0


class KeyedPolicy(BatchPolicy):
    """A :class:`BatchPolicy` that serves waiting requests by :meth:`key` (smallest first).

    Running requests also get tokens in key order. With ``preempt: true`` in
    the parameters, a full batch gives up its largest-key request (the latest
    admitted among ties) whenever the head of the queue has a strictly smaller
    key.
    """

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.preemptive = bool(getattr(params, "preempt", False))
        if ctx is not None:
            ctx.waiting = KeyedQueue(self.key)

    def key(self, req: Request) -> Any:
        """Sort key of ``req`` (smaller runs first); computed when it is queued."""
        raise NotImplementedError

    def order_running(self) -> Iterable[Request]:
        return sorted(self.running, key=self.key)

    def victim(self, head: Request) -> Request | None:
        if not self.running:
            return None
        key = self.key
        worst = max(reversed(self.running), key=key)
        return worst if key(head) < key(worst) else None


class ClassLevels:
    """A request's priority level (smaller is more important).

    With a ``classes`` mapping (class name -> level) the level comes from the
    request's class, and a request whose class is not listed is an error;
    without one it is the request's own ``priority``.
    """

    def __init__(self, classes: dict[str, int] | None) -> None:
        self.classes = classes

    def __call__(self, req: Request) -> int:
        classes = self.classes
        if classes is None:
            return req.priority
        level = classes.get(req.cls)  # type: ignore[arg-type]
        if level is None:
            raise SimulationError(
                f"request {req.label} has class {req.cls!r}, which policy.classes does not list "
                f"({', '.join(map(str, classes))})"
            )
        return level


class LengthPredictor:
    """Predicted output lengths: the true one, or the true one times ``exp(N(0, sigma))``.

    ``sigma = 0`` is the oracle. The noise is drawn once per request, when
    the policy first asks, from the run's policy generator (``ctx.rng``), so a
    run stays reproducible and the workload's draws are untouched. The
    median prediction is the true length; ``sigma = 0.5`` puts two thirds of
    the predictions within a factor 1.65 of it.
    """

    def __init__(self, sigma: float, ctx: SchedulerContext) -> None:
        self.sigma = sigma
        self.ctx = ctx
        self._pred: dict[int, float] = {}

    def __call__(self, req: Request) -> float:
        if self.sigma == 0.0:
            return float(req.output_len)
        pred = self._pred.get(req.id)
        if pred is None:
            pred = self._pred[req.id] = req.output_len * math.exp(
                self.sigma * float(self.ctx.rng.standard_normal()))
        return pred

    def forget(self, req: Request) -> None:
        """Drop ``req``'s prediction (it left the system)."""
        self._pred.pop(req.id, None)
