"""``round_robin``: replicas in turn, whatever their load."""

from __future__ import annotations

from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RouterView, RoutingPolicy


@routers.register("round_robin")
class RoundRobin(RoutingPolicy):
    """Request ``k`` (in arrival order) goes to replica ``k mod n`` (skipping unavailable ones)."""

    def __init__(self, params: ComponentParams, view: RouterView) -> None:
        super().__init__(params, view)
        self._next = 0

    def choose(self, req: Request) -> int:
        view = self.view
        i = self._next
        if view.num_available < view.n:  # skip replicas the router may not use
            for _ in range(view.n):
                if view.available[i]:
                    break
                i = (i + 1) % view.n
        self._next = (i + 1) % view.n
        return i
