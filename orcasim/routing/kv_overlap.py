"""``kv_overlap``: prompt tokens already cached on a replica, minus its queued work."""

from __future__ import annotations

from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("kv_overlap")
class KVOverlap(RoutingPolicy):
    """Score ``overlap_weight * cached_i - load_i`` in tokens: ``cached_i`` the leading prompt
    tokens replica ``i``'s prefix cache holds now, ``load_i`` the prompt tokens of its
    outstanding requests (as last scraped). Maximising it minimises the prefill the request
    adds plus the work already queued, a KV router's cost; ties go to the lowest index."""

    needs_prefix_cache = True

    class Params(ComponentParams):
        overlap_weight: float = Field(1.0, ge=0, description="weight of a cached prompt token "
                                      "against a queued one")

    def scores(self, req: Request) -> list[float]:
        w = self.params.overlap_weight
        view = self.view
        return [w * h - t for h, t in zip(view.prefix_hit_tokens(req), view.tokens, strict=True)]
