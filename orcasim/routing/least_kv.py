"""``least_kv``: the replica whose KV pool is least used."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("least_kv")
class LeastKV(RoutingPolicy):
    """Lowest share of KV memory allocated (score ``1 - usage``); ties go to the lowest index.

    Replicas without a memory limit report 0 usage.
    """

    needs_kv_usage = True

    def scores(self, req: Request) -> list[float]:
        return [1.0 - u for u in self.view.kv_usage]
