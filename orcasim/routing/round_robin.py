"""``round_robin``: replicas in turn, whatever their load."""

from __future__ import annotations

from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RouterView, RoutingPolicy


@routers.register("round_robin")
class RoundRobin(RoutingPolicy):
    """Request ``k`` (in arrival order) goes to replica ``k mod n``."""

    def __init__(self, params: ComponentParams, view: RouterView) -> None:
        super().__init__(params, view)
        self._next = 0

    def choose(self, req: Request) -> int:
        i = self._next
        self._next = (i + 1) % self.view.n
        return i
