"""``priority``: strict priority between classes, first come first served within one.

A request's level comes from its class (``classes: {interactive: 0, batch:
1}``; smaller is more important) or, without that mapping, from its
``priority``. Waiting requests are admitted lowest level first. With
``preempt: true``, a full batch preempts (by recompute) its lowest-priority
request for a waiting one of a strictly higher class.

Aging (``aging_s``) keeps a low class from starving: a waiting request gains
one level for every ``aging_s`` seconds it has waited. Since every waiting
request ages at the same rate, this order is fixed when a request is
queued: it is the order of ``arrival + level x aging_s``, as if a request of
level L had arrived ``L x aging_s`` later. A batch request that has waited
``aging_s`` seconds goes ahead of interactive requests arriving after that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from orcasim.context import SchedulerContext
from orcasim.policies.common import TokenParams
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.keys import ClassLevels, row_columns
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("priority")
class Priority(KeyedPolicy):
    """Strict priority classes, optionally preemptive, with optional aging."""

    runs_unchanged = True  # static keys: a full batch's victim cannot change between arrivals

    class Params(TokenParams):
        classes: dict[str, int] | None = Field(
            None, description="class -> level, smaller first (default: the request's priority)")
        preempt: bool = Field(False, description="preempt lower classes when the batch is full")
        aging_s: float | None = Field(
            None, gt=0, description="a waiting request gains one level every aging_s seconds")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        self.level = ClassLevels(params.classes)
        self._least = min(params.classes.values()) if params.classes else None  # least level
        self.aging_s = params.aging_s
        super().__init__(params, ctx)

    def arrival_may_preempt(self) -> bool:
        """Only a key below the largest running one preempts. With a ``classes`` mapping no
        level is below its least, and without one none is below the least ``priority`` of the
        requests still to come, so a request arriving from now on has a key of at least
        ``(least level, now)`` (``now + least level x aging_s`` with aging)."""
        least = self._least
        if least is None:
            ahead = getattr(self.ctx.source, "least_ahead", None)
            if ahead is None:
                return True
            least = ahead("priority", 0)
            if least is None:
                return False  # nobody left to arrive
        if not self.running:
            return True
        worst = self.rank(self.memory_victim())
        if self.aging_s is None:
            return least < worst[0]
        return self.ctx.env.now + least * self.aging_s < worst[0]

    key_width = 2  # (key: a pair)

    def key(self, req: Request) -> Any:
        if self.aging_s is None:
            return (self.level(req), req.arrival)
        return (req.arrival + self.level(req) * self.aging_s, 0)

    def index_key(self, source: Any) -> Callable[[int], Any] | None:
        cols = row_columns(source)
        arrival, classes, aging = source._arrival, self.level.classes, self.aging_s
        prio, cls = cols.get("priority"), cols.get("cls")
        if classes is not None and cls is None:
            return None  # no request has a class: key() says so

        def of_row(i: int) -> Any:
            if classes is None:
                level = prio[i] if prio is not None else 0
            else:
                level = classes.get(cls[i])
                if level is None:  # not listed: key() says so
                    return self.key(source._request(i, arrival[i]))
            return (level, arrival[i]) if aging is None else (arrival[i] + level * aging, 0)

        return of_row
