"""The admission-controller interface and the gate that runs them on every arrival.

A controller is a registered component with a ``Params`` model, built with
the run's :class:`~orcasim.context.SchedulerContext`. On each arrival the
:class:`Gate` calls every controller's :meth:`~AdmissionController.check`
in scenario order; the first reason returned rejects the request (recorded
with that reason). If none objects, each controller's
:meth:`~AdmissionController.accepted` runs, so a controller commits state
(takes a rate-limit token, sheds a queued request) only for requests that
are really admitted.

The gate also applies the scenario's ``drain`` and ``hard_stop`` times:
a request arriving at or after a drain is rejected with reason
``draining``, at or after a hard stop with ``stopped``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.request import Request


class AdmissionController:
    """Decides whether an arriving request may queue."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        self.params = params
        self.ctx = ctx

    def check(self, req: Request) -> str | None:
        """The reason to reject ``req``, or ``None`` to let it through."""
        raise NotImplementedError

    def accepted(self, req: Request) -> None:
        """``req`` passed every controller and is being queued (commit state here)."""


class Gate:
    """The arrival check of one run: drain / hard-stop times, then the controllers in order."""

    def __init__(
        self,
        controllers: Sequence[AdmissionController] = (),
        drain_at: float = math.inf,
        stop_at: float = math.inf,
    ) -> None:
        self.controllers = list(controllers)
        self.drain_at = drain_at
        self.stop_at = stop_at

    def __call__(self, req: Request) -> str | None:
        if req.arrival >= self.stop_at:
            return "stopped"
        if req.arrival >= self.drain_at:
            return "draining"
        controllers = self.controllers
        for c in controllers:
            reason = c.check(req)
            if reason is not None:
                return reason
        for c in controllers:
            c.accepted(req)
        return None


def reject_all(reason: str) -> Callable[[Request], str | None]:
    """A gate that rejects every arrival with ``reason`` (after a hard stop)."""

    def gate(req: Request) -> str | None:
        return reason

    return gate
