"""``least_tokens``: the replica with the fewest queued + running prompt tokens."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy, normalized_low


@routers.register("least_tokens")
class LeastTokens(RoutingPolicy):
    """Fewest prompt tokens among the replica's outstanding requests (what a router knows of
    their work: output lengths are unknown to it); ties go to the lowest index."""

    def scores(self, req: Request) -> list[float]:
        return normalized_low(self.view.tokens)
