"""``random``: a uniformly random replica, drawn from the run's router stream."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("random")
class RandomRouting(RoutingPolicy):
    """Each request goes to a replica drawn uniformly (seeded by the run; no global state)."""

    def choose(self, req: Request) -> int:
        view = self.view
        if view.num_available < view.n:
            avail = view.available_indices()
            return avail[int(view.rng.integers(len(avail)))] if avail else 0
        return int(view.rng.integers(view.n))
