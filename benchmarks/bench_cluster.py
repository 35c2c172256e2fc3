"""Cost per simulated step of a cluster against one replica, and a cluster's peak memory.

Each cluster size runs the seed scenario's continuous policy on every replica
with the load per replica held fixed (Poisson at 30 req/s per replica,
``--per-replica`` requests each), so a cluster of ``n`` runs ``n`` times the
steps of one replica. Prints wall seconds per simulated step (all replicas'
steps together; CPU time of this process, so other processes' load does not
count) and its ratio to the one-replica run in the same process, for each
routing policy: a ratio near 1 means the per-step cost does not grow with the
replica count.

``--memory N`` also runs 16 replicas serving ``N`` requests (default 1,000,000
with ``--memory`` alone) in a child process and prints its peak resident set
size.

    python benchmarks/bench_cluster.py [--per-replica 3000] [--sizes 1 4 16]
    python benchmarks/bench_cluster.py --memory 1000000
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import orcasim
from orcasim.simulation import generate_workload, run_variant

ROUTERS = ("round_robin", "least_outstanding", "power_of_d", "prefix_affinity")


def config(n: int, per_replica: int, router: str):
    """The seed scenario's continuous variant on ``n`` replicas behind ``router``."""
    return orcasim.load_scenario("seed_orca").override({
        "workload.num_requests": per_replica * n,
        "workload.arrival.rate": 30.0 * n,
        "cluster": {"router": router, "groups": [{"count": n}]},
    }).variant("continuous")


def per_step(n: int, per_replica: int, router: str, repeat: int) -> tuple[float, int]:
    """Best CPU seconds per simulated step over ``repeat`` runs, and the step count."""
    cfg = config(n, per_replica, router)
    arrays = generate_workload(cfg)
    best = float("inf")
    steps = 0
    for _ in range(repeat):
        t0 = time.process_time()
        res = run_variant(cfg, arrays)
        dt = time.process_time() - t0
        steps = int(res.summary["num_steps"])
        best = min(best, dt / steps)
    return best, steps


def memory_child(num_requests: int) -> None:
    """Run 16 replicas on ``num_requests`` requests; print the peak RSS in MiB."""
    cfg = config(16, num_requests // 16, "least_outstanding")
    t0 = time.perf_counter()
    res = run_variant(cfg, generate_workload(cfg))
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"16 replicas, {int(res.summary['num_requests']):,} requests, "
          f"{int(res.summary['num_steps']):,} steps: {dt:.1f} s wall, peak RSS {peak:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-replica", type=int, default=3000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS))
    ap.add_argument("--memory", type=int, nargs="?", const=1_000_000, default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        memory_child(args.child)
        return
    print(f"{'router':<20}{'replicas':>9}{'steps':>10}{'us/step':>10}{'ratio':>8}")
    for router in args.routers:
        base = None
        for n in args.sizes:
            t, steps = per_step(n, args.per_replica, router, args.repeat)
            base = t if base is None else base
            print(f"{router:<20}{n:>9}{steps:>10}{t * 1e6:>10.2f}{t / base:>8.2f}")
    if args.memory:
        subprocess.run([sys.executable, __file__, "--child", str(args.memory)], check=True)


if __name__ == "__main__":
    main()
