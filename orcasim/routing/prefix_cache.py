"""``prefix_cache``: the replica whose prefix cache holds most of the prompt."""

from __future__ import annotations

from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("prefix_cache")
class PrefixCacheScorer(RoutingPolicy):
    """Score: share of the prompt each replica's prefix cache holds now (0 to 1).

    Alone it ignores load; combine it with a load scorer under ``weighted``.
    """

    needs_prefix_cache = True

    def scores(self, req: Request) -> list[float]:
        p = max(1, req.prompt_len)
        return [h / p for h in self.view.prefix_hit_tokens(req)]
