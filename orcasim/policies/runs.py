"""Runs of unchanged decode steps: what a policy tells the engine, and how it applies a run.

The engine may advance a run of steps in which the batch cannot change in one
event (see :mod:`orcasim.engine`). A policy says how long its batch can run
unchanged after the step it just planned (``decode_run``) and applies a
whole run at its end (``complete_run``), with the same effects as one
:meth:`~orcasim.policies.base.Policy.complete_step` per step. These mixins
hold both for :class:`~orcasim.policies.base.DecodeOnlyPolicy` (every member
of a :class:`~orcasim.batch.DecodeBatch` gains a token per step) and
:class:`~orcasim.policies.base.TokenPolicy` (steps in which every running
request decodes one token). ``tests/test_batch_runs.py`` compares every
policy that opts in (``runs_unchanged = True``) with step-by-step simulation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from orcasim.plan import StepPlan

if TYPE_CHECKING:
    from orcasim.request import Request


class DecodeRuns:
    """Runs of a decode-only policy's batch (mixed into ``DecodeOnlyPolicy``)."""

    batch: Any
    _runs: bool
    _listens: bool
    _deferred: list[Request]

    #: whether :meth:`decode_run` may offer runs (the policy's :meth:`admit` takes a request
    #: only at a boundary where :meth:`has_room` is true)
    runs_unchanged: ClassVar[bool] = False

    def has_room(self) -> bool:
        """Whether a request that arrives now could join the batch at the next boundary."""
        return True

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """After the step just planned, how the batch runs on unchanged (the engine's fast path).

        ``(size, kv, max_steps, room)``: the batch's ``size`` sequences read
        ``kv`` KV tokens in the following step (``size`` more each step after);
        nobody finishes before step ``max_steps`` (counting the planned one);
        ``room``: an arrival could join at a boundary, so the run must stop
        at the first step ending at or after the next arrival. ``None``: step
        by step (memory limits, event-driven processes, a joiner still deferred).
        """
        if not self._runs or self._listens or self._deferred or getattr(
                self, "kv", None) is not None:
            return None
        batch = self.batch
        size = batch.size
        return size, batch.num_kv_tokens + size, batch.first_finish(), self.has_room()

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan`` then ``len(ends) - 1`` more steps of the same batch, ending at ``ends``.

        Only within what :meth:`decode_run` allowed: nobody finishes before
        the last step. Equal to :meth:`complete_step` once per step.
        """
        self._complete(plan, ends[0], ends[-1], len(ends))


class TokenRuns:
    """Runs of a token-level policy's steps after which every running request decodes
    (mixed into ``TokenPolicy``)."""

    running: list[Request]
    ctx: Any
    params: Any
    _runs: bool

    #: whether :meth:`decode_run` may offer runs (a policy opts in, and the engine's tests
    #: compare it with step-by-step simulation): its plan of a step depends only on the
    #: running requests, the waiting queue and arrivals; a step in which every running
    #: request decodes gives each of them one token (within the budget); its victim for a
    #: waiting request cannot appear without an arrival; and a step has no effect beyond
    #: :meth:`complete_step`
    runs_unchanged: ClassVar[bool] = False
    #: whether :meth:`decode_run` may offer runs, and :meth:`decode_budget` (found at its
    #: first call)
    _run_offer: bool | None = None
    _run_budget: int = 0
    #: whether a waiting request may take the place of a running one (then every arrival
    #: ends a run, since it may preempt)
    preemptive: bool = False

    def has_room(self) -> bool:
        """Whether a waiting request could be admitted at the next boundary."""
        slots = self.ctx.slots
        return slots.count < slots.capacity

    def decode_budget(self) -> int:
        """Tokens the step rule schedules in a step at most (a preemptive policy's plan that
        spent them all did not look at the queue's head)."""
        budget: int = getattr(self.params, "token_budget", 1 << 62)
        return budget

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """After ``plan``, how many steps the batch can run unchanged (the engine's fast path).

        Only when ``plan`` schedules every running request for all the tokens
        it is missing (a decode token, or the rest of its prompt, which then
        emits its first token), without memory limits: each following step
        then decodes one token for every one of them until a request
        finishes, as long as nobody is admitted (the batch has no room, or
        nobody waits) and no arrival may preempt. Returns ``(size, kv,
        max_steps, room)`` as :meth:`DecodeOnlyPolicy.decode_run`; ``room``:
        every arrival ends the run.
        """
        offer = self._run_offer
        if offer is None:  # (whether runs may be offered at all: once)
            offer = self._run_offer = (self._runs and not self.event_driven  # type: ignore[attr-defined]
                                       and getattr(self, "mem", None) is None)
            self._run_budget = self.decode_budget()
        if not offer or plan is None:
            return None
        size = len(self.running)
        if plan.num_seqs != size:  # (then each later step's decodes fit the budget too)
            return None
        room = self.has_room()
        waiting = self.ctx.waiting
        if (room or (self.preemptive and plan.num_tokens >= self._run_budget)) and waiting:
            return None  # someone could join (or preempt: the plan spent the budget before
            # looking at the queue), or waits for a reason of the policy's
        left = self.steps_left(plan)
        if not left:
            return None  # a prompt chunk: it needs more than one token next step
        return (size, plan.num_kv_tokens + plan.num_tokens, left,
                room or (self.preemptive and self.arrival_may_preempt()))

    def arrival_may_preempt(self) -> bool:
        """Whether a request arriving from now on could preempt a running one (a preemptive
        policy; default: yes, so every arrival ends a run)."""
        return True

    def steps_left(self, plan: StepPlan) -> int:
        """Steps until the first of ``plan``'s requests finishes, counting ``plan`` (0: some
        scheduled request does not complete its known tokens in ``plan``)."""
        left = 1 << 62
        for req, n in plan.scheduled or ():
            out = req.num_output_tokens
            if req.num_computed_tokens + n < (req.prompt_len or 1) + out:
                return 0
            if req.output_len - out < left:
                left = req.output_len - out
        return left

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan``, then ``len(ends) - 1`` decode steps of the same batch, ending at ``ends``.

        Only within what :meth:`decode_run` allowed (every scheduled request
        emits a token each step; nobody finishes before the last step). One
        pass with the effects of :meth:`complete_step` once per step: the
        first step's first tokens and inter-token gaps, one token per step for
        every request, and the last step's finishers, which leave in the
        order that step schedules them (:meth:`last_step_order`). Every
        request left runs decodes only: :meth:`decoding` notes their KV
        tokens and the steps until the first of them finishes.
        """
        ctx = self.ctx
        k = len(ends)
        prev_end = ctx.last_step_end
        t1, t_end = ends[0], ends[-1]
        before_last = ends[-2] if k > 1 else prev_end
        record_itl = ctx.recorder.record_itl
        bulk = kv = 0
        left = 1 << 62
        more = k - 1  # tokens each computes after the first step
        finished: list[Request] = []
        for req, n in plan.scheduled or ():
            out = req.num_output_tokens
            if out == 0:
                req.first_token = t1
            elif req.last_token == prev_end:
                bulk += 1
            else:
                record_itl(t1 - req.last_token)  # type: ignore[operator]
            out += k
            rest = req.output_len - out
            if rest > 0:
                req.num_computed_tokens = c = req.num_computed_tokens + n + more
                req.num_output_tokens = out
                req.last_token = t_end
                kv += c
                if rest < left:
                    left = rest
            else:  # it finishes in the last step: leave it as that step finds it
                req.num_computed_tokens += n + more - 1
                req.num_output_tokens = out - 1
                req.last_token = before_last
                finished.append(req)
        plan.num_itl_tokens = bulk
        if finished:
            if k > 1 and len(finished) > 1:
                finished = self.last_step_order(finished)
            self.finish_run(finished, t_end)
        running = self.running
        self.decoding = (running, len(running), kv, left)

    def finish_run(self, finished: list[Request], t_end: float) -> None:
        """``finished``, as the last step of a run finds them and in its order, emit their
        last token at ``t_end``, leave the batch and are recorded."""
        running = self.running
        for req in finished:
            req.num_computed_tokens += 1
            req.num_output_tokens += 1
            req.last_token = t_end
            running.remove(req)
        ctx = self.ctx
        release = self.release  # type: ignore[attr-defined]
        slots = ctx.slots
        if ctx.on_end is None and not slots._getters and slots._freed is None:
            for req in finished:  # nobody acts on an end: all released, then all finished
                release(req)
            ctx.finish_all(finished, t_end)
            return
        for req in finished:
            release(req)
            ctx.finish(req, t_end)

    #: after a run, while nothing else changed the batch: ``(self.running, its length, KV
    #: tokens, steps until the first finishes)``, every running request decoding
    decoding: tuple[list[Request], int, int, int] | None = None

    def last_step_order(self, reqs: list[Request]) -> list[Request]:
        """Running ``reqs``, as a decode step finds them, in the order it schedules them.

        The default: the order of ``self.running``.
        """
        return sorted(reqs, key=self.running.index)
