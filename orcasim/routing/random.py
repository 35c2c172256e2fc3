"""``random``: a uniformly random replica, drawn from the run's router stream."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("random")
class RandomRouting(RoutingPolicy):
    """Each request goes to a replica drawn uniformly (seeded by the run; no global state)."""

    def choose(self, req: Request) -> int:
        return int(self.view.rng.integers(self.view.n))
