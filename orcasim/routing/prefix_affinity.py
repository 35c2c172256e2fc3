"""``prefix_affinity``: consistent hashing of the prompt's leading blocks, with a load fallback.

The fallback is SGLang's router's: affinity holds while the cluster is balanced,
and only when it is imbalanced by both an absolute and a relative margin
(``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``
outstanding requests; SGLang's defaults 64 and 1.5) does the request go to the
least loaded replica. Consistent hashing with bounded loads (a replica takes at
most ``load_factor`` times the mean) is the optional stricter rule.
"""

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
    """A hash ring with ``vnodes`` points per replica; a request goes to the first available
    replica clockwise from its key's hash, so prompts with the same leading blocks meet the
    same cache. When the cluster is imbalanced (both thresholds exceeded, on outstanding
    requests as last scraped) it goes to the least loaded replica instead. With
    ``load_factor`` set, the walk also passes replicas whose outstanding requests would
    exceed ``ceil(load_factor * (total + 1) / n)`` (consistent hashing with bounded loads).
    O(log(n * vnodes)) per request plus O(n) for the balance check."""

    class Params(ComponentParams):
        prefix_blocks: int = Field(2, ge=1, description="leading hash blocks that form the key")
        vnodes: int = Field(64, ge=1, le=4096, description="ring points per replica")
        balance_abs_threshold: int = Field(64, ge=0, description="imbalanced only if the most "
                                           "loaded replica has more than this many outstanding "
                                           "requests above the least loaded")
        balance_rel_threshold: float = Field(1.5, ge=1.0, description="... and more than this "
                                             "times the least loaded one's")
        load_factor: float | None = Field(None, ge=1.0, description="bounded loads: a replica "
                                          "takes no more than this times the mean outstanding "
                                          "requests (+1); unset: no bound")

    def __init__(self, params: Params, view: RouterView) -> None:
        super().__init__(params, view)
        ring = sorted((stable_hash((name, v)), i) for i, name in enumerate(view.names)
                      for v in range(params.vnodes))
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        #: decisions the load fallback took away from the ring's choice
        self.num_overridden = 0

    def imbalanced(self) -> bool:
        """SGLang's test, over the available replicas' outstanding requests."""
        view, p = self.view, self.params
        loads = [n for n, ok in zip(view.outstanding, view.available, strict=True) if ok]
        if not loads:
            return False
        hi, lo = max(loads), min(loads)
        return hi - lo > p.balance_abs_threshold and hi > p.balance_rel_threshold * lo

    def choose(self, req: Request) -> int:
        view, p = self.view, self.params
        load = view.outstanding
        avail = view.available
        cap = math.inf
        if p.load_factor is not None:
            cap = math.ceil(p.load_factor * (sum(load) + 1) / view.n)
        h = stable_hash(affinity_key(req, p.prefix_blocks))
        points, owners = self._points, self._owners
        m = len(points)
        k = bisect.bisect_left(points, h)
        home = -1
        for j in range(m):
            i = owners[(k + j) % m]
            if avail[i]:
                if home < 0:
                    home = i
                if load[i] + 1 <= cap:
                    break
        else:
            i = -1
        if i < 0 or self.imbalanced():
            i = argmin([n if ok else math.inf for n, ok in zip(load, avail, strict=True)])
        if i != home:
            self.num_overridden += 1
        return i
