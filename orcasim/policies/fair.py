"""Fair sharing between groups of requests (classes or tenants) with virtual token counters.

The scheme of the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024): each group has a counter of the service
it received, ``w_input x prompt tokens + w_output x output tokens``, divided
by the group's weight. When the batch has room, the next request comes from
the backlogged group with the smallest counter. A group that was idle and
gets a new request has its counter lifted to the smallest counter of the
backlogged groups (or of the last group served, when none is), so it cannot
bank service while idle and then starve the others.

With weights, a group with weight 2 receives twice the service of a group
with weight 1 while both are backlogged: this is a weighted share.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from typing import Any, ClassVar

from pydantic import Field, PositiveFloat

from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.common import BatchPolicy, TokenParams
from orcasim.policies.grouped import GroupedQueue
from orcasim.policies.pooled import PooledPlans
from orcasim.request import Request
from orcasim.source import OpenLoopSource


class FairParams(TokenParams):
    """Parameters of the fair-share policies."""

    weights: dict[str, PositiveFloat] = Field(default_factory=dict,
                                              description="share weight per group (default 1)")
    w_input: float = Field(1.0, ge=0, description="counter cost of a prompt token")
    w_output: float = Field(2.0, ge=0, description="counter cost of an output token")


class FairSharePolicy(BatchPolicy):
    """Admit from the backlogged group with the least weighted service so far.

    Every step charges each group ``w_output`` (over its weight) per token its
    requests emit, when the step is planned. In a run of unchanged steps (see
    :mod:`orcasim.policies.runs`) the charges of the steps after the first
    are applied at the run's end, step by step in effect
    (:func:`add_repeated`); a group's counter is read during a run only when
    an arrival finds its group idle (:meth:`_lift`), and that lift is replayed
    at the run's end between the charges of the steps that started before it
    and those that started after, on the groups that were backlogged when it
    came. The counters are thus the step-by-step ones whenever a decision
    reads them. A planned step in which every running request emits is
    charged when a counter is next read or changed otherwise (charges alone
    commute: each adds its group's token cost), so a run's end adds its first
    step's charge with the others, in one pass over the groups.
    """

    Params: ClassVar[type[ComponentParams]] = FairParams
    #: the request attribute that names its group (``tenant`` or ``cls``)
    group_attr: ClassVar[str] = "tenant"
    runs_unchanged = True
    #: off: :meth:`admit_waiting` takes the general steps of :class:`BatchPolicy`
    lean_admission: ClassVar[bool] = True
    #: off: :meth:`planned` charges every plan through :meth:`charge`
    lean_charge: ClassVar[bool] = True

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self._counters: dict[Hashable, float] = {}  # (counters, less the unpaid charges)
        #: the charges of the latest plans in which every running request emits, not added
        #: yet: (emitters per group, steps); added before anything else reads or changes a
        #: counter (charges alone commute: each adds its group's token cost)
        self._unpaid: tuple[dict[Hashable, int], int] | None = None
        self._last_served: float = 0.0
        attr = self.group_attr
        self._weights: dict[str, float] = dict(params.weights)  # type: ignore[attr-defined]
        self._queue = GroupedQueue(lambda r: getattr(r, attr), self._least_served, self._lift,
                                   attr)
        if ctx is not None:
            ctx.waiting = self._queue
        #: running requests per group
        self._running_groups: dict[Hashable, int] = {}
        #: its groups with running requests (a step's emitters when all running emit)
        self._all_emit: dict[Hashable, int] | None = None
        self._token_cost: dict[Hashable, float] = {}  # a group's counter cost of a token
        #: the latest plan and its emitting requests per group
        self._emitting: tuple[StepPlan | None, dict[Hashable, int]] = (None, {})
        #: the run in flight: each later step's emitting requests per group (None: no run)
        self._run_counts: dict[Hashable, int] | None = None
        #: lifts during the run in flight: (time, group, the groups then backlogged)
        self._lifts: list[tuple[float, Hashable, list[Hashable]]] = []
        #: whether :meth:`steps_left` is the one that make_plan notes
        self._plain_left = type(self).steps_left is PooledPlans.steps_left
        #: whether :meth:`planned` may leave the charge of a plan in which all emit unpaid
        self._lean_charge = self._plain_left and self.mem is None and self.lean_charge
        self._divisor: dict[Hashable, float] = {}  # a group's weight (weight(g), once)
        if self.decode_run is not None:  # (None: no runs)
            # the engine asks before a run (then lifts wait for its end); a loop that takes
            # the plain decode_run's path without asking reaches no arrival before the run's
            # end, and complete_run notes the emitters itself
            self.decode_run = self._offer_run  # type: ignore[method-assign]

    def weight(self, group: Any) -> float:
        return self._weights.get(group, 1.0)

    @property
    def counters(self) -> dict[Hashable, float]:
        """Each group's counter, every charge so far added."""
        if self._unpaid is not None:
            self._pay()
        return self._counters

    def _pay(self) -> None:
        """Add the unpaid charges."""
        counts, steps = self._unpaid  # type: ignore[misc]
        self._unpaid = None
        self._charge(counts, steps)

    def _least_served(self, groups: list[Hashable]) -> Hashable:
        if len(groups) == 1:
            return groups[0]
        counters = self.counters
        return min(groups, key=lambda g: counters.get(g, 0.0))

    def _lift(self, group: Hashable, req: Request) -> None:
        """``req`` arrived and found ``group`` idle (when it arrived, whenever it is queued)."""
        backlogged = self._queue.backlogged()
        if self._run_counts is not None:  # a run is in flight: replayed at its end
            self._lifts.append((req.arrival, group, backlogged))
        else:
            self._lift_to(group, backlogged)

    def _lift_to(self, group: Hashable, backlogged: list[Hashable]) -> None:
        """Lift ``group``'s counter to the least counter of ``backlogged`` (or the last served)."""
        counters = self.counters
        floor = min(counters.get(g, 0.0) for g in backlogged) if backlogged else self._last_served
        counters[group] = max(counters.get(group, 0.0), floor)
        self._queue.forget_choice()

    def _weight_of(self, group: Hashable) -> float:
        """:meth:`weight`, asked once per group."""
        w = self._divisor.get(group)
        if w is None:
            w = self._divisor[group] = self.weight(group)
        return w

    def admitted(self, req: Request) -> None:
        g = getattr(req, self.group_attr)
        cost = self.params.w_input * (  # type: ignore[attr-defined]
            (req.prompt_len or 1) + req.num_output_tokens - req.num_computed_tokens)  # (its
        # num_tokens - num_computed_tokens)
        counters = self.counters
        w = self._divisor.get(g)
        counters[g] = c = counters.get(g, 0.0) + cost / (w if w is not None
                                                          else self._weight_of(g))
        self._last_served = c
        running = self._running_groups
        running[g] = running.get(g, 0) + 1
        self._queue._chosen = []  # (forget_choice)
        self._all_emit = None

    #: :meth:`admit_waiting`'s ways, found at its first call: in place, and ``admitted`` too
    _lean: tuple[bool, bool] | None = None

    def admit_waiting(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        """:meth:`BatchPolicy.admit_waiting` from its :class:`GroupedQueue` without memory
        limits or preemption, the same steps with the chosen group's queue at hand."""
        ctx = self.ctx
        q = ctx.waiting
        lean = self._lean
        if lean is None:  # (the class's switch and hooks, read at the first admission)
            lean = self._lean = (self.lean_admission and self.mem is None
                                 and not self.preemptive,
                                 type(self).admitted is FairSharePolicy.admitted)
        if q is not self._queue or not lean[0]:
            return super().admit_waiting(scheduled, budget)
        slots = ctx.slots
        running = self.running
        admit = ctx.admit
        # FairSharePolicy.admitted, in place: its counter, its running count, the choice
        admitted = None if lean[1] else self.admitted
        if self._unpaid is not None:  # (before the admissions change counters)
            self._pay()
        counters, divisor = self._counters, self._divisor
        running_groups = self._running_groups
        w_input = self.params.w_input  # type: ignore[attr-defined]
        queues = q.queues
        make, arrival = q._make, q._arrival
        while budget > 0 and slots.count < slots.capacity and q._n:
            chosen = q._chosen  # (queue[0]: the chosen group's head)
            if chosen:
                g = chosen[0]
            elif len(queues) == 1:  # (next_group: the only group, which waits)
                g = next(iter(queues))
            else:
                g = q.next_group()
            gq = queues[g]
            head = gq[0]
            if type(head) is int:
                head = gq[0] = make(head, arrival[head])  # type: ignore[misc]
            full = need = (head.prompt_len or 1) + head.num_output_tokens - head.num_computed_tokens
            if need > budget:
                if self.chunked:
                    need = budget
                elif scheduled:
                    break  # head-of-line: it waits for a step with room
                elif head.num_output_tokens == 0 and need > self.params.token_budget:
                    q.popleft()
                    ctx.reject(head, "prompt_too_long")
                    continue
            gq.popleft()  # (queue.popleft: pop_group of the chosen group)
            q._n -= 1
            if not gq:
                q._chosen = []
            admit(head)
            running.append(head)
            self.decoding = None  # the batch changed
            scheduled.append((head, need))
            budget -= need
            if admitted is not None:
                admitted(head)
                continue
            # (admitted: the head's group is g; ``full`` is its num_tokens - computed tokens)
            w = divisor.get(g)
            counters[g] = c = counters.get(g, 0.0) + w_input * full / (
                w if w is not None else self._weight_of(g))
            self._last_served = c
            running_groups[g] = running_groups.get(g, 0) + 1
            q._chosen = []
            self._all_emit = None
        return budget

    def release(self, req: Request) -> None:
        if self.mem is not None:  # (without a memory limit there is nothing to free)
            super().release(req)
        g = getattr(req, self.group_attr)
        running = self._running_groups
        m = running[g] - 1
        if m:
            running[g] = m
        else:
            del running[g]
        self._all_emit = None

    def planned(self, plan: StepPlan) -> StepPlan:
        """:meth:`charge` ``plan``; a plan in which every running request emits (the steps
        left that make_plan noted say so) leaves its charge unpaid until a counter is read or
        changed otherwise (a run's end adds it with the run's other steps)."""
        noted, left = self._left
        if not (noted is plan and left and self._lean_charge
                and plan.num_seqs == len(self.running)):
            self.charge(plan)
            return plan
        counts = self._all_emit
        if counts is None:  # (kept until a request joins or leaves; never changed)
            counts = self._all_emit = self._running_groups.copy()
        self._emitting = (plan, counts)
        unpaid = self._unpaid  # (its charge: one step more unpaid)
        if unpaid is None:
            self._unpaid = (counts, 1)
        elif unpaid[0] is counts:
            self._unpaid = (counts, unpaid[1] + 1)
        else:
            self._pay()
            self._unpaid = (counts, 1)
        self._queue._chosen = []  # (forget_choice: the counters changed)
        return plan

    def charge(self, plan: StepPlan) -> None:
        """Charge each group ``w_output`` for every token its requests emit in ``plan``."""
        if self._unpaid is not None:
            self._pay()
        noted, left = self._left  # (steps_left, as make_plan noted it)
        if noted is not plan or not self._plain_left:
            left = self.steps_left(plan)
        if self.mem is None and plan.num_seqs == len(self.running) and left:
            # every running request emits
            counts = self._all_emit
            if counts is None:  # (kept until a request joins or leaves; never changed)
                counts = self._all_emit = self._running_groups.copy()
        else:
            counts = {}
            attr = self.group_attr
            for req, n in plan.scheduled or ():
                if req.num_computed_tokens + n >= req.num_tokens:
                    g = getattr(req, attr)
                    counts[g] = counts.get(g, 0) + 1
        self._emitting = (plan, counts)
        self._charge(counts, 1)

    def _charge(self, counts: dict[Hashable, int], steps: int) -> None:
        """``steps`` steps in which ``counts[g]`` requests of each group ``g`` emit a token."""
        counters = self._counters
        costs = self._token_cost
        for g, m in counts.items():
            c = costs.get(g)
            if c is None:
                c = costs[g] = self.params.w_output / self.weight(g)  # type: ignore[attr-defined]
            n = m * steps
            x = counters.get(g, 0.0)
            if n == 1:  # (one token: x + c)
                counters[g] = x + c
            elif ((x * 16777216.0).is_integer() and (c * 16777216.0).is_integer()
                  and x + n * c < 268435456.0):  # (add_repeated's exact case, in place)
                counters[g] = x + n * c
            else:
                counters[g] = add_repeated(x, c, n)
        self._queue._chosen = []  # (forget_choice)

    def _offer_run(self, plan: StepPlan | None = None) -> tuple[int, int, int, bool] | None:
        """:meth:`decode_run`, noting the run's emitters per group (its later steps' charges,
        and the lifts that wait for them): a plan the step rule did not charge runs step by
        step."""
        noted, counts = self._emitting
        if noted is not plan:  # not planned by the step rule (never charged): step by step
            return None
        run = type(self).decode_run(self, plan)
        if run is not None:
            self._run_counts = counts
        return run

    def complete_run(self, plan: StepPlan, ends: list[float]) -> None:
        counts = self._run_counts
        if counts is None:  # taken without asking _offer_run (a plan the step rule charged)
            noted, counts = self._emitting
            if noted is not plan:  # (never charged: each later step charges the batch's)
                counts = self._running_groups.copy()
            self._run_counts = counts
        ctx = self.ctx
        src = ctx.source
        if type(src) is OpenLoopSource:  # (ctx.poll_arrivals, for a lazy one)
            if src.lazy:  # the run's arrivals, which lift between its steps
                now = ctx.env._now
                i = src._next
                if i < src._n and src._arrival[i] <= now:
                    src.flush(now)
        elif src is not None and src.lazy:
            ctx.poll_arrivals()
        k = len(ends) - 1
        if self._lifts:
            self._settle(ends, k)
        else:  # (_settle without lifts; with the unpaid charge of its first step)
            self._run_counts = None
            unpaid = self._unpaid
            if unpaid is not None and unpaid[0] is counts:
                self._unpaid = None
                k += unpaid[1]
            if k:
                self._charge(counts, k)
        super().complete_run(plan, ends)

    #: right after a run its :meth:`schedule` is the plain one: the run's charges are settled
    #: (see :func:`~orcasim.policies.token_loop.plain_after_run`)
    plain_after_run: ClassVar[bool] = True

    def schedule(self) -> list[tuple[Request, int]]:
        if self._run_counts is not None:  # the engine ran the offered run's first step alone
            self._settle([], 0)
        return super().schedule()

    def _settle(self, starts: list[float], k: int) -> None:
        """Charge the run's steps that start at ``starts[:k]`` (after its first: the ends of
        the steps before them), with its lifts."""
        counts, self._run_counts = self._run_counts, None
        assert counts is not None
        lifts = self._lifts
        done = 0  # steps charged: a lift at time t comes after the steps that start before t
        if lifts:
            self._lifts = []
            for t, group, backlogged in lifts:
                n = bisect.bisect_left(starts, t, done, k)
                if n > done:
                    self._charge(counts, n - done)
                    done = n
                self._lift_to(group, backlogged)
        if k > done:
            self._charge(counts, k - done)


def add_repeated(x: float, c: float, n: int) -> float:
    """``x + c + c + ...`` (``n`` times, left to right) in floating point, exactly.

    In one multiplication when every partial sum is exact (``x`` and ``c``
    multiples of 2**-24 and the total below 2**28: integer token costs with
    weights that are powers of two), else one addition at a time.
    """
    if n <= 0:
        return x
    if ((x * 16777216.0).is_integer() and (c * 16777216.0).is_integer()
            and x + n * c < 268435456.0):
        return x + n * c
    for _ in range(n):
        x += c
    return x
