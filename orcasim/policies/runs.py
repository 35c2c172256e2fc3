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
    """Runs of a token-level policy's all-decode steps (mixed into ``TokenPolicy``)."""

    running: list[Request]
    ctx: Any
    _runs: bool

    #: whether :meth:`decode_run` may offer runs (a policy opts in, and the engine's tests
    #: compare it with step-by-step simulation): its plan of a step depends only on the
    #: running requests (which all decode), the waiting queue and arrivals, its victim for
    #: a waiting request cannot appear without an arrival, and a step has no effect beyond
    #: :meth:`complete_step`
    runs_unchanged: ClassVar[bool] = False
    #: whether a waiting request may take the place of a running one (then every arrival
    #: ends a run, since it may preempt)
    preemptive: bool = False

    def has_room(self) -> bool:
        """Whether a waiting request could be admitted at the next boundary."""
        slots = self.ctx.slots
        return slots.count < slots.capacity

    def decode_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """After ``plan``, how many steps the batch can decode unchanged (the engine's fast path).

        Only when ``plan`` runs every running request for one decode token,
        without memory limits: then each following step does the same until
        a request finishes, as long as nobody is admitted (the batch has no
        room, or nobody waits) and no arrival may preempt. Returns
        ``(size, kv, max_steps, room)`` as
        :meth:`DecodeOnlyPolicy.decode_run`; ``room``: every arrival ends the run.
        """
        if (not self._runs or plan is None or self.event_driven
                or getattr(self, "mem", None) is not None):
            return None
        running = self.running
        size = len(running)
        if plan.num_seqs != size or plan.num_decode_tokens != size or plan.num_prefill_tokens:
            return None
        room = self.has_room()
        if room and self.ctx.waiting:
            return None  # someone waits and could join: the policy holds it back for a reason
        left = min(r.output_len - r.num_output_tokens for r in running)
        return size, plan.num_kv_tokens + size, left, room or self.preemptive

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        """``plan``, then the same decode step ``len(ends) - 1`` more times, ending at ``ends``.

        Only within what :meth:`decode_run` allowed: the first step as
        :meth:`complete_step` does it, the ones between in bulk (one token for
        every request each, none finishes), the last one as
        :meth:`complete_step` again, so its finishers end as they would.
        """
        ctx = self.ctx
        self.complete_step(plan, ctx.last_step_end, ends[0])
        k = len(ends)
        if k == 1:
            return
        scheduled = plan.scheduled or []
        if k > 2:
            more, t = k - 2, ends[-2]
            for req, _ in scheduled:
                req.num_computed_tokens += more
                req.num_output_tokens += more
                req.last_token = t
        ctx.last_step_end = ends[-2]
        last = self.make_plan([(req, 1) for req, _ in scheduled])
        self.complete_step(last, ends[-2], ends[-1])
