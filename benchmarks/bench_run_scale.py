"""``orcasim run`` at scale: simulation time, output-writing time and peak memory.

For each size, the seed scenario's continuous variant (the notebook's
distributions, Poisson at 30 req/s, max_batch 32) is run twice:

- in this process, phase by phase as ``orcasim run`` does them (draw and check
  the workload, simulate with the summary, write every output: summary files,
  ``requests.parquet``, ``series.csv`` and the plots), printing CPU seconds
  per phase and the ratio of writing to simulating;
- as the command itself in a child process, printing its CPU seconds and its
  peak resident memory.

    python benchmarks/bench_run_scale.py [--sizes 1000000] [--csv] [--command-only]

``--command-only`` skips the in-process phases (at ten million requests they
double the time and the memory the machine needs) and prints the command's
figures only.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orcasim
from orcasim.commands.preflight import check_scenario
from orcasim.simulation import simulate


def phases(n: int, out: Path, csv: bool) -> tuple[float, float, float]:
    """CPU seconds to draw and check the workload, to simulate, and to write every output."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n})
    t0 = time.process_time()
    drawn = check_scenario(sc, None, ["continuous"])
    t1 = time.process_time()
    res = simulate(sc, variants=["continuous"], workloads=drawn)
    t2 = time.process_time()
    res.write(out, plots=True, **({"requests_csv": True} if csv else {}))
    t3 = time.process_time()
    return t1 - t0, t2 - t1, t3 - t2


def whole_command(n: int, out: Path, csv: bool) -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of ``orcasim run`` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "orcasim", "run", "seed_orca", "--variant", "continuous",
           "--set", f"workload.num_requests={n}", "--out", str(out)] + (["--csv"] if csv else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, after.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--csv", action="store_true", help="also write requests.csv")
    ap.add_argument("--command-only", action="store_true",
                    help="only the orcasim run child process (wall and CPU time, peak RSS)")
    args = ap.parse_args()
    if args.command_only:
        print(f"{'requests':>9}  {'wall s':>7}  {'orcasim run CPU s':>17}  {'peak RSS MB':>11}")
        for n in args.sizes:
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                cpu, rss = whole_command(n, Path(tmp) / "b", args.csv)
                wall = time.perf_counter() - t
            print(f"{n:>9}  {wall:>7.1f}  {cpu:>17.2f}  {rss:>11.0f}", flush=True)
        return
    print(f"{'requests':>9}  {'check s':>8}  {'simulate s':>10}  {'write s':>8}  "
          f"{'write/simulate':>14}  {'orcasim run s':>13}  {'peak RSS MB':>11}")
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            c, s, w = phases(n, Path(tmp) / "a", args.csv)
            cpu, rss = whole_command(n, Path(tmp) / "b", args.csv)
        print(f"{n:>9}  {c:>8.2f}  {s:>10.2f}  {w:>8.2f}  {w / s:>14.3f}  {cpu:>13.2f}  "
              f"{rss:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
