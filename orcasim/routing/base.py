"""The routing-policy interface and what a router sees of its replicas.

A routing policy is a registered component (``@routers.register("name")``)
with a ``Params`` model, built with the cluster's :class:`RouterView`. For
each arriving request the router calls :meth:`RoutingPolicy.choose`, which
returns the index of the replica that gets it. Scoring policies also expose
:meth:`RoutingPolicy.scores` (higher is better), which the routing log
records next to each decision.

The view shows replica load as a real router sees it: scraped every
``staleness`` seconds (0: read live at each decision). Prefix-cache contents
are read live (a KV-event-fed index, as in Dynamo's KV router and llm-d's
precise prefix scorer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from orcasim.params import ComponentParams
from orcasim.request import Request


class RouterView:
    """What a routing policy can read: replica count, load per replica, prefix hits, an rng.

    ``outstanding[i]``: requests routed to replica ``i`` that have not ended;
    ``available[i]``: whether the router may send to replica ``i`` (policies that do not
    score replicas pick among the available ones; a scoring policy's pick of an unavailable
    replica is replaced by the router with the best-scored available one).
    ``tokens[i]``: their prompt tokens (the router's measure of queued + running work: it
    does not know output lengths); ``kv_usage[i]``: the
    share of replica ``i``'s KV pool allocated (0 without a memory limit).
    """

    def __init__(self, names: Sequence[str], rng: np.random.Generator) -> None:
        self.names = list(names)
        self.n = len(self.names)
        self.rng = rng
        self.outstanding: list[int] = [0] * self.n
        self.tokens: list[int] = [0] * self.n
        self.kv_usage: list[float] = [0.0] * self.n
        #: replicas the router may send to now (False: known to be down, or not started)
        self.available: list[bool] = [True] * self.n
        self.num_available = self.n

    def set_available(self, i: int, ok: bool) -> None:
        """Mark replica ``i`` routable or not."""
        if self.available[i] != ok:
            self.available[i] = ok
            self.num_available += 1 if ok else -1

    def available_indices(self) -> list[int]:
        """Indices of the routable replicas (O(replicas); used only when some are not)."""
        return [i for i, ok in enumerate(self.available) if ok]

    def prefix_hit_tokens(self, req: Request) -> list[int]:
        """Leading prompt tokens of ``req`` each replica's prefix cache holds now."""
        return [0] * self.n


class RoutingPolicy:
    """Picks a replica for each arriving request."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams
    #: reads replicas' prefix caches (needs replicas whose policy keeps one)
    needs_prefix_cache: ClassVar[bool] = False
    #: reads replicas' KV usage (refreshed before each decision when the view is live)
    needs_kv_usage: ClassVar[bool] = False

    def __init__(self, params: ComponentParams, view: RouterView) -> None:
        self.params = params
        self.view = view

    def choose(self, req: Request) -> int:
        """The index of the replica that gets ``req``."""
        scores = self.scores(req)
        if scores is None:
            raise NotImplementedError
        return argmax(scores)

    def scores(self, req: Request) -> list[float] | None:
        """Per-replica scores for ``req``, higher is better (``None``: not a scoring policy)."""
        return None


def argmax(scores: Sequence[float]) -> int:
    """Index of the highest score; ties go to the lowest index (deterministic)."""
    best, best_i = scores[0], 0
    for i in range(1, len(scores)):
        if scores[i] > best:
            best, best_i = scores[i], i
    return best_i


def argmin(values: Sequence[Any]) -> int:
    """Index of the lowest value; ties go to the lowest index."""
    best, best_i = values[0], 0
    for i in range(1, len(values)):
        if values[i] < best:
            best, best_i = values[i], i
    return best_i


def normalized_low(values: Sequence[float]) -> list[float]:
    """Scores in [0, 1] that favour low ``values``: 1 at the minimum, 0 at the maximum."""
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
