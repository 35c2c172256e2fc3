"""``weighted``: a weighted sum of scoring policies' scores."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orcasim.errors import ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RouterView, RoutingPolicy

#: where a weighted router's scorers sit in a scenario (for error messages)
SCORERS_PATH = "cluster.router.scorers"


@routers.register("weighted")
class Weighted(RoutingPolicy):
    """Sum of ``weight * score`` over ``scorers`` (each a scoring routing policy with a
    ``weight``), highest wins, ties to the lowest index, as endpoint pickers combine
    scorers. E.g. ``{type: weighted, scorers: [{type: prefix_cache, weight: 2},
    {type: least_outstanding, weight: 1}]}``."""

    class Params(ComponentParams):
        scorers: list[dict[str, Any]] = Field(min_length=1)

    def __init__(self, params: Params, view: RouterView) -> None:
        super().__init__(params, view)
        from orcasim.spec import build_spec

        self.parts: list[tuple[float, RoutingPolicy]] = []
        for k, entry in enumerate(params.scorers):
            path = f"{SCORERS_PATH}.{k}"
            entry = dict(entry)
            weight = entry.pop("weight", 1.0)
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
                raise ScenarioError(f"{path}.weight", f"must be a number >= 0 (got {weight!r})")
            spec = build_spec(routers, entry, path)
            if spec.cls.scores is RoutingPolicy.scores or spec.cls is Weighted:
                raise ScenarioError(f"{path}.type", f"routing policy {spec.type!r} does not "
                                    "score replicas (scorers: least_outstanding, least_tokens, "
                                    "least_kv, prefix_cache, kv_overlap)")
            self.parts.append((float(weight), spec.create(view)))
        self.needs_prefix_cache = any(p.needs_prefix_cache for _, p in self.parts)
        self.needs_kv_usage = any(p.needs_kv_usage for _, p in self.parts)

    def scores(self, req: Request) -> list[float]:
        total = [0.0] * self.view.n
        for w, part in self.parts:
            for i, s in enumerate(part.scores(req)):
                total[i] += w * s
        return total
