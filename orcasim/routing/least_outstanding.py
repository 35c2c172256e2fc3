"""``least_outstanding``: the replica with the fewest requests routed to it and not ended."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy, normalized_low


@routers.register("least_outstanding")
class LeastOutstanding(RoutingPolicy):
    """Fewest outstanding requests (as last scraped); ties go to the lowest index."""

    def scores(self, req: Request) -> list[float]:
        return normalized_low(self.view.outstanding)
