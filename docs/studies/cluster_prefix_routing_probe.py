"""Where the prefix-routing study's cache hits go: one run, every routing decision probed.

For each request, at the moment it is routed: the leading prompt tokens the
best replica's prefix cache holds, those the chosen replica holds, and the
prefix that earlier requests already sent somewhere (what an unbounded cache
would serve); for ``prefix_affinity``, how often the load fallback overrode the
hash ring. Comparing the three separates routing losses from eviction.

    python docs/studies/cluster_prefix_routing_probe.py VARIANT [--seed 0]
        [--set policy.num_blocks=400000 ...]
"""

from __future__ import annotations

import argparse
from typing import Any

import orcasim
from orcasim.cluster.router import Router
from orcasim.request import Request

HASH_BLOCK = 512  # tokens per Mooncake hash block


def probe(variant: str, seed: int, overrides: list[str]) -> dict[str, Any]:
    """Run ``variant`` of the study with a probe on :meth:`Router.route`; shares of all
    prompt tokens, and the request counts."""
    rows: list[tuple[int, int, int, int]] = []  # best, chosen, known, prompt_len
    sent: dict[tuple[int, ...], int] = {}  # leading hash blocks -> replica they went to
    moved = [0, 0]  # requests with a >1-block known prefix; of them, sent elsewhere
    routers: list[Router] = []
    original = Router.route

    def route(self: Router, req: Request) -> None:
        hits = self.view.prefix_hit_tokens(req)
        ids = list(req.hash_ids or [])
        k, where = 0, None
        while k < len(ids) and tuple(ids[:k + 1]) in sent:
            where = sent[tuple(ids[:k + 1])]
            k += 1
        before = list(self.routed)
        original(self, req)
        i = next(j for j, (a, b) in enumerate(zip(before, self.routed, strict=True)) if a != b)
        for j in range(len(ids)):
            sent[tuple(ids[:j + 1])] = i
        if k > 1:
            moved[0] += 1
            moved[1] += where != i
        rows.append((max(hits), hits[i], min(k * HASH_BLOCK, req.prompt_len - 1),
                     req.prompt_len))
        if not routers:
            routers.append(self)

    Router.route = route  # type: ignore[method-assign]
    try:
        sc = orcasim.load_scenario("cluster_prefix_routing", overrides=overrides or None)
        res = orcasim.simulate(sc, seed=seed, variants=[variant])
    finally:
        Router.route = original  # type: ignore[method-assign]
    total = sum(r[3] for r in rows)
    out = {"hit_rate": res.summary[variant]["prefix_cache_hit_rate"],
           "ttft_p99": res.summary[variant]["ttft_p99"],
           "best_cached": sum(r[0] for r in rows) / total,
           "chosen_cached": sum(r[1] for r in rows) / total,
           "sent_before": sum(r[2] for r in rows) / total,
           "requests_with_known_prefix": moved[0], "sent_elsewhere": moved[1]}
    overridden = getattr(routers[0].policy, "num_overridden", None)
    if overridden is not None:
        out["fallback_overrides"] = overridden
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    args = p.parse_args(argv)
    for k, v in probe(args.variant, args.seed, args.set).items():
        print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
