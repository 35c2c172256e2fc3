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

from bench_core import bench, load_notebook_loop

MEMORY = {"ample": {"block_size": 16, "num_blocks": 100_000},
          "tight": {"block_size": 16, "num_blocks": 400}}


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
            a, b, r, s = bench(n, rep, nb, {"memory": MEMORY[which]}, check=which == "ample")
            print(f"{which:>6}  {n:>9}  {a:>10.4f}  {b:>10.4f}  {r:>6.3f}  "
                  f"{int(s['num_preemptions']):>11}")


if __name__ == "__main__":
    main()
