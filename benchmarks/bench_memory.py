"""Wall time of the memory-limited continuous policy against the seed notebook's own loop.

Same requests and latency model as ``bench_core.py`` (the notebook's
workload, Poisson at 30 req/s, max_batch 32), with a paged ``memory`` section
of 16-token blocks:

- ``ample``: 100,000 blocks, never binding: results must equal the notebook's;
- ``tight``: 400 blocks (6,400 tokens), so admission is refused and running
  requests are preempted (recompute) many times.

Prints the median wall-time ratio orcasim / notebook loop for each size.

    python benchmarks/bench_memory.py [--repeat 3] [--sizes 500 50000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_core import load_notebook_loop

import orcasim
from orcasim.simulation import run_variant
from orcasim.workload.base import WorkloadArrays

MEMORY = {"ample": {"block_size": 16, "num_blocks": 100_000},
          "tight": {"block_size": 16, "num_blocks": 400}}


def bench(n: int, repeat: int, nb, which: str) -> tuple[float, float, float, dict]:
    cfg = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": n, "memory": MEMORY[which]}).variant("continuous")
    reqs0 = nb.workload(n, 30.0, 0)
    import numpy as np

    arrays = WorkloadArrays(
        arrival=np.array([r["arrival"] for r in reqs0]),
        prompt_len=np.array([r["prompt_len"] for r in reqs0], dtype=np.int64),
        output_len=np.array([r["output_len"] for r in reqs0], dtype=np.int64),
    )
    step = nb.lat((0.005, 0.0008, 0.00002))
    t_nb, t_os, ratios = [], [], []
    summary: dict = {}
    for _ in range(repeat):
        reqs = nb.workload(n, 30.0, 0)
        t0 = time.perf_counter()
        nb.continuous(reqs, 32, step)
        ref = nb.summarise(reqs)
        a = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = run_variant(cfg, arrays)
        b = time.perf_counter() - t0
        if which == "ample":
            assert res.summary["e2e_p99"] == ref["e2e_p99"], "results differ from the notebook"
        summary = res.summary
        t_nb.append(a)
        t_os.append(b)
        ratios.append(b / a)
    return statistics.median(t_nb), statistics.median(t_os), statistics.median(ratios), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 50_000])
    args = ap.parse_args()
    nb = load_notebook_loop()
    print(f"{'memory':>6}  {'requests':>9}  {'notebook s':>10}  {'orcasim s':>10}  "
          f"{'ratio':>6}  {'preemptions':>11}")
    for which in MEMORY:
        for n in args.sizes:
            rep = args.repeat if n < 10_000 else max(1, args.repeat // 2 + 1)
            a, b, r, s = bench(n, rep, nb, which)
            print(f"{which:>6}  {n:>9}  {a:>10.4f}  {b:>10.4f}  {r:>6.3f}  "
                  f"{int(s['num_preemptions']):>11}")


if __name__ == "__main__":
    main()
