"""Wall time of orcasim's continuous variant against the seed notebook's own loop.

Both run in this process on the same requests (the notebook's distributions,
Poisson at 30 req/s, max_batch 32): the notebook loop with its summary, and
orcasim's ``run_variant`` (SimPy model, recorder and full summary). Prints the
median wall-time ratio orcasim / notebook loop for 500 and 50,000 requests.

    python benchmarks/bench_core.py [--repeat 5] [--sizes 500 50000]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import orcasim
from orcasim.simulation import run_variant
from orcasim.workload.base import WorkloadArrays

HERE = Path(__file__).resolve().parent


def load_notebook_loop():
    spec = importlib.util.spec_from_file_location("notebook_loop", HERE / "notebook_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["notebook_loop"] = mod
    spec.loader.exec_module(mod)
    return mod


def bench(
    n: int, repeat: int, nb, overrides: dict | None = None, check: bool = True
) -> tuple[float, float, float, dict]:
    """Median seconds (notebook, orcasim), the median of per-pair ratios, and orcasim's summary.

    ``overrides`` are applied to the seed scenario; with ``check`` orcasim's
    results must equal the notebook loop's.
    """
    cfg = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": n, **(overrides or {})}).variant("continuous")
    reqs0 = nb.workload(n, 30.0, 0)
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
        if check:
            assert res.summary["e2e_p99"] == ref["e2e_p99"], "results differ from the notebook loop"
        summary = res.summary
        t_nb.append(a)
        t_os.append(b)
        ratios.append(b / a)
    return statistics.median(t_nb), statistics.median(t_os), statistics.median(ratios), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 50_000])
    args = ap.parse_args()
    nb = load_notebook_loop()
    print(f"{'requests':>9}  {'notebook s':>10}  {'orcasim s':>10}  {'ratio orcasim/notebook':>22}")
    for n in args.sizes:
        a, b, r, _ = bench(n, args.repeat if n < 10_000 else max(1, args.repeat // 2 + 1), nb)
        print(f"{n:>9}  {a:>10.4f}  {b:>10.4f}  {r:>22.3f}")


if __name__ == "__main__":
    main()
