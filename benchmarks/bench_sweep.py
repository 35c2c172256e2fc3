"""Sweep wall time: workers, and the cost of storing every run.

Runs one grid (the seed study at several arrival rates, both variants,
several seeds) in this process:

- serially (``n_jobs=1``) and with each worker count given, in memory, and
  prints the wall time and the speed-up over the serial run (the tables must
  be identical, timing column aside);
- serially into a directory (one JSON per run plus parquet rows for the first
  seed of every point) against the serial in-memory run: the storage overhead;
- then the same directory again: a resumed sweep that finds everything done.

Each line also gives the per-run overhead: the sweep's wall time less the
time spent inside the runs (their ``wall_s``: workload, simulation, checks),
over the workers, per run. The parallel sweep runs twice: the first pays for
starting the workers (each imports orcasim once), the second reuses them.

    python benchmarks/bench_sweep.py [--jobs 2 4] [--seeds 4] [--requests 500] [--repeat 3]

The machine's other load shows in the figures: compare ratios from one
invocation, not seconds across machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import pandas as pd

import orcasim

RATES = [0.25, 0.5, 1.0, 1.5, 2.0]


REPEAT = 1


def timed(**kw):  # type: ignore[no-untyped-def]
    """Median wall time of REPEAT sweeps (a stored sweep is redone in a fresh directory)."""
    times = []
    for _ in range(REPEAT if "out" not in kw else 1):
        t = time.perf_counter()
        df = orcasim.sweep(progress=False, **kw)
        times.append(time.perf_counter() - t)
    return statistics.median(times), df


def overhead(wall: float, df: pd.DataFrame, workers: int, runs: int) -> float:
    """Milliseconds per run of the sweep's wall time not spent inside runs."""
    inside = float(df["wall_s"].sum()) / min(workers, os.cpu_count() or 1)
    return 1000 * max(wall - inside, 0.0) / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[2])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1, help="median of this many in-memory sweeps")
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    sc = orcasim.load_scenario().override({"workload.num_requests": args.requests})
    common = {"scenario": sc, "grid": {"workload.arrival.rate": RATES}, "seeds": args.seeds}
    runs = len(RATES) * 2 * args.seeds
    print(f"{runs} runs ({len(RATES)} rates x 2 variants x {args.seeds} seeds, "
          f"{args.requests} requests each), {os.cpu_count()} cores")
    t1, ref = timed(n_jobs=1, **common)
    print(f"  1 worker : {t1:7.2f} s  ({t1 / runs * 1000:.0f} ms per run, "
          f"{overhead(t1, ref, 1, runs):.1f} ms overhead per run)")
    for j in args.jobs:
        for state in ("cold", "warm"):
            tj, df = timed(n_jobs=j, **common)
            pd.testing.assert_frame_equal(df.drop(columns="wall_s"), ref.drop(columns="wall_s"))
            print(f"  {j:2d} workers ({state}): {tj:7.2f} s  speed-up {t1 / tj:.2f}x, "
                  f"{overhead(tj, df, j, runs):.1f} ms overhead per run  (same table)")
    with tempfile.TemporaryDirectory() as d:
        ts, _ = timed(n_jobs=1, out=d, **common)
        print(f"  1 worker, stored in a directory: {ts:7.2f} s  ({ts / t1:.2f}x in memory)")
        tr, again = timed(n_jobs=1, out=d, **common)
        print(f"  resumed, all {runs} runs done: {tr:7.2f} s, "
              f"{again.attrs['sweep']['computed']} computed")


if __name__ == "__main__":
    main()
