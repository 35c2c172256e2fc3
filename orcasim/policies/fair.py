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

from collections.abc import Hashable
from typing import Any, ClassVar

from pydantic import Field, PositiveFloat

from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.policies.common import BatchPolicy, TokenParams
from orcasim.policies.queues import GroupedQueue
from orcasim.request import Request


class FairParams(TokenParams):
    """Parameters of the fair-share policies."""

    weights: dict[str, PositiveFloat] = Field(default_factory=dict,
                                              description="share weight per group (default 1)")
    w_input: float = Field(1.0, ge=0, description="counter cost of a prompt token")
    w_output: float = Field(2.0, ge=0, description="counter cost of an output token")


class FairSharePolicy(BatchPolicy):
    """Admit from the backlogged group with the least weighted service so far."""

    Params: ClassVar[type[ComponentParams]] = FairParams
    #: the request attribute that names its group (``tenant`` or ``cls``)
    group_attr: ClassVar[str] = "tenant"
    runs_unchanged = False  # every step charges the groups (see :meth:`charge`)

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.counters: dict[Hashable, float] = {}
        self._last_served: float = 0.0
        attr = self.group_attr
        self._weights: dict[str, float] = dict(params.weights)  # type: ignore[attr-defined]
        self._queue = GroupedQueue(lambda r: getattr(r, attr), self._least_served, self._lift)
        if ctx is not None:
            ctx.waiting = self._queue

    def weight(self, group: Any) -> float:
        return self._weights.get(group, 1.0)

    def _least_served(self, groups: list[Hashable]) -> Hashable:
        counters = self.counters
        return min(groups, key=lambda g: counters.get(g, 0.0))

    def _lift(self, group: Hashable) -> None:
        counters = self.counters
        backlogged = self._queue.backlogged()
        floor = min(counters.get(g, 0.0) for g in backlogged) if backlogged else self._last_served
        counters[group] = max(counters.get(group, 0.0), floor)

    def admitted(self, req: Request) -> None:
        g = getattr(req, self.group_attr)
        cost = self.params.w_input * (req.num_tokens - req.num_computed_tokens)  # type: ignore[attr-defined]
        self.counters[g] = c = self.counters.get(g, 0.0) + cost / self.weight(g)
        self._last_served = c

    def next_step(self) -> Any:
        plan = yield from super().next_step()
        if plan is not None:
            self.charge(plan)
        return plan

    def charge(self, plan: StepPlan) -> None:
        """Charge each group ``w_output`` for every token its requests emit in ``plan``."""
        w_out = self.params.w_output  # type: ignore[attr-defined]
        counters = self.counters
        attr = self.group_attr
        for req, n in plan.scheduled or ():
            if req.num_computed_tokens + n >= req.num_tokens:
                g = getattr(req, attr)
                counters[g] = counters.get(g, 0.0) + w_out / self.weight(g)
