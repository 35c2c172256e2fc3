"""``power_of_d``: sample ``d`` distinct replicas, send to the least loaded of them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RoutingPolicy


@routers.register("power_of_d")
class PowerOfD(RoutingPolicy):
    """Power of ``d`` choices: ``d`` distinct replicas drawn uniformly (Floyd's sampling, O(d)
    draws from the run's router stream), the one with the lowest ``metric`` wins (ties: the
    first drawn)."""

    class Params(ComponentParams):
        d: int = Field(2, ge=1, description="replicas sampled per request")
        metric: Literal["outstanding", "tokens"] = "outstanding"

    def choose(self, req: Request) -> int:
        view = self.view
        n, d = view.n, self.params.d
        load = view.outstanding if self.params.metric == "outstanding" else view.tokens
        pool = None
        if view.num_available < n:  # sample among the replicas the router may use
            pool = view.available_indices() or [0]
            n = len(pool)
        if d >= n:
            picks = list(range(n))
        else:
            rng = view.rng
            picks = []
            chosen: set[int] = set()
            for j in range(n - d, n):  # Floyd: d distinct values of range(n)
                t = int(rng.integers(j + 1))
                pick = j if t in chosen else t
                chosen.add(pick)
                picks.append(pick)
        if pool is not None:
            picks = [pool[k] for k in picks]
        best = picks[0]
        for i in picks[1:]:
            if load[i] < load[best]:
                best = i
        return best
