"""Routing policies: which replica of a cluster gets each request. One file and one
registration each (see :mod:`orcasim.routing.base`)."""

from orcasim.routing import (
    kv_overlap,
    least_kv,
    least_outstanding,
    least_tokens,
    power_of_d,
    prefix_affinity,
    prefix_cache,
    random,
    round_robin,
    weighted,
)
from orcasim.routing.base import RouterView, RoutingPolicy

__all__ = ["RouterView", "RoutingPolicy", "kv_overlap", "least_kv", "least_outstanding",
           "least_tokens", "power_of_d", "prefix_affinity", "prefix_cache", "random",
           "round_robin", "weighted"]
