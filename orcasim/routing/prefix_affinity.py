"""``prefix_affinity``: consistent hashing of the prompt's leading blocks, with bounded load."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Hashable

from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.registry import routers
from orcasim.request import Request
from orcasim.routing.base import RouterView, RoutingPolicy, argmin


def stable_hash(key: Hashable) -> int:
    """A 64-bit hash of ``repr(key)`` that is the same in every process (no hash seed)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big")


def affinity_key(req: Request, blocks: int) -> Hashable:
    """What identifies a prompt's prefix: its first ``blocks`` hash ids, else its shared
    prefix id, else the request itself (no affinity)."""
    if req.hash_ids:
        return ("h", tuple(req.hash_ids[:blocks]))
    if req.prefix_id is not None:
        return ("p", req.prefix_id)
    return ("r", req.id)


@routers.register("prefix_affinity")
class PrefixAffinity(RoutingPolicy):
    """A hash ring with ``vnodes`` points per replica; a request goes to the first replica
    clockwise from its key's hash whose outstanding requests stay within
    ``ceil(load_factor * (total + 1) / n)`` (consistent hashing with bounded loads), so
    prompts with the same leading blocks meet the same cache until that replica is full.
    O(log(n * vnodes)) per request plus the walk past full replicas."""

    class Params(ComponentParams):
        prefix_blocks: int = Field(2, ge=1, description="leading hash blocks that form the key")
        vnodes: int = Field(64, ge=1, le=4096, description="ring points per replica")
        load_factor: float = Field(1.25, ge=1.0, description="a replica takes no more than "
                                   "this times the mean outstanding requests (+1)")

    def __init__(self, params: Params, view: RouterView) -> None:
        super().__init__(params, view)
        ring = sorted((stable_hash((name, v)), i) for i, name in enumerate(view.names)
                      for v in range(params.vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]

    def choose(self, req: Request) -> int:
        view = self.view
        load = view.outstanding
        cap = math.ceil(self.params.load_factor * (sum(load) + 1) / view.n)
        h = stable_hash(affinity_key(req, self.params.prefix_blocks))
        points, owners = self._points, self._owners
        m = len(points)
        k = bisect.bisect_left(points, h)
        avail = view.available
        for j in range(m):
            i = owners[(k + j) % m]
            if load[i] + 1 <= cap and avail[i]:
                return i
        return argmin(load)
