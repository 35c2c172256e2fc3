"""Wall time of ``orcasim replay-vllm`` on the shipped 300-request RTX PRO 6000 run.

Runs the command in a fresh interpreter (imports included, as a user runs
it), with and without plots, ``--repeat`` times each, and prints the median
wall time and its ratio to the 2 s target. Needs ``../shared/realdata``
beside the checkout (or ``--realdata DIR``).

    python benchmarks/bench_replay.py [--repeat 3] [--realdata ../shared/realdata]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0


def command(real: Path, out: Path, plots: bool) -> list[str]:
    cmd = [sys.executable, "-m", "orcasim", "replay-vllm",
           str(real / "vllm_runs" / "RTXPRO6000_Llama-3.1-8B"),
           "--workload", str(real / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
           "--profiles", str(real / "profiles" / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B"
                             / "bf16"),
           "--gpu-memory-gb", "96", "--out", str(out)]
    return cmd if plots else [*cmd, "--no-plots"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--realdata", type=Path, default=ROOT.parent / "shared" / "realdata")
    args = p.parse_args()
    if not (args.realdata / "vllm_runs").is_dir():
        sys.exit(f"{args.realdata}: no vllm_runs/ (give --realdata)")
    with tempfile.TemporaryDirectory() as tmp:
        for plots in (False, True):
            times = []
            for i in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run(command(args.realdata, Path(tmp) / f"out{i}", plots), check=True,
                               stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            print(f"replay-vllm, 300 requests, {'with' if plots else 'without'} plots: "
                  f"median {med:.2f} s wall over {args.repeat} runs "
                  f"({med / TARGET_S:.2f} x the {TARGET_S:g} s target)")


if __name__ == "__main__":
    main()
