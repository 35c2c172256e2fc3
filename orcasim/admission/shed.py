"""``shed``: under overload, shed the lowest class first.

When an arrival finds ``limit`` requests waiting, the least important
request among the waiting ones that have not started yet and the newcomer is
rejected with reason ``shed``: the one with the largest level (``classes``:
class -> level, smaller is more important; else the request's
``priority``), the latest arrival among equals. So an interactive request
displaces a queued batch request, while a batch request arriving at a full
queue is turned away.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.admission.base import AdmissionController
from orcasim.context import SchedulerContext
from orcasim.errors import SimulationError
from orcasim.params import ComponentParams
from orcasim.registry import admission
from orcasim.request import Request


@admission.register("shed")
class Shed(AdmissionController):
    """At ``limit`` waiting, reject the lowest-class request (queued or arriving): ``shed``."""

    class Params(ComponentParams):
        limit: int = Field(gt=0, description="waiting requests at which shedding starts")
        classes: dict[str, int] | None = Field(
            None, description="class -> level, smaller is more important (default: priority)")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self._victim: Request | None = None

    def level(self, req: Request) -> int:
        classes = self.params.classes
        if classes is None:
            return req.priority
        level = classes.get(req.cls)  # type: ignore[arg-type]
        if level is None:
            raise SimulationError(f"request {req.label} has class {req.cls!r}, which "
                                  f"admission shed.classes does not list")
        return level

    def check(self, req: Request) -> str | None:
        self._victim = None
        waiting = self.ctx.waiting
        if len(waiting) < self.params.limit:
            return None
        worst: Request | None = None
        worst_key = (self.level(req), req.arrival, req.id)
        for r in waiting:
            if r.first_scheduled is None:
                k = (self.level(r), r.arrival, r.id)
                if k > worst_key:
                    worst, worst_key = r, k
        if worst is None:
            return "shed"
        self._victim = worst
        return None

    def accepted(self, req: Request) -> None:
        victim = self._victim
        if victim is not None:
            self._victim = None
            self.ctx.waiting.remove(victim)
            self.ctx.reject(victim, "shed")
