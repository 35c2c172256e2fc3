"""When does continuous batching give 2x the throughput of static batching?

Sweeps the fixed (per-step) share of the step cost and the offered load on
the seed workload, and prints the continuous/static throughput ratio. The
fixed share is measured, not assumed: the fraction of the continuous run's
busy time spent on the per-step ``base`` cost. Load is the arrival rate as a
multiple of the continuous engine's capacity (its throughput when saturated).

    python docs/studies/two_x.py [--requests 500] [--seed 0]
"""

from __future__ import annotations

import argparse

import orcasim

BASES = (0.0, 0.005, 0.025, 0.1, 0.4)  # seconds per step; 0.005 is the notebook's
LOADS = (0.5, 0.9, 1.5, 15.0)  # offered load / capacity; the notebook's is about 15


def study(requests: int = 500, seed: int = 0, bases=BASES, loads=LOADS) -> list[dict]:
    """One row per (base, load): fixed share, capacity, rates and throughput ratio."""
    base_sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": requests})
    rows = []
    for base in bases:
        sc = base_sc.override({"engine.latency.base": base})
        sat = orcasim.simulate(sc.override({"workload.arrival.rate": 1e6}), seed=seed,
                               variants=["continuous"])["continuous"].summary
        capacity = sat["requests_per_s"]
        fixed_share = base * sat["num_steps"] / (sat["busy_fraction"] * sat["makespan_s"])
        for load in loads:
            res = orcasim.simulate(sc.override({"workload.arrival.rate": load * capacity}),
                                   seed=seed).summary
            rows.append({
                "base_s": base,
                "fixed_share": fixed_share,
                "load": load,
                "rate_req_s": load * capacity,
                "static_tok_s": res["static"]["throughput_tok_s"],
                "continuous_tok_s": res["continuous"]["throughput_tok_s"],
                "ratio": res["continuous"]["throughput_tok_s"] / res["static"]["throughput_tok_s"],
                "static_e2e_p99": res["static"]["e2e_p99"],
                "continuous_e2e_p99": res["continuous"]["e2e_p99"],
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = study(args.requests, args.seed)
    print("| base (ms) | fixed share | load | rate (req/s) | static tok/s | continuous tok/s "
          "| ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {1000 * r['base_s']:g} | {r['fixed_share']:.0%} | {r['load']:g} "
              f"| {r['rate_req_s']:.3g} | {r['static_tok_s']:.1f} | {r['continuous_tok_s']:.1f} "
              f"| {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
