"""The scaling figure of the performance page: steps per CPU second and peak memory vs requests.

Each point is a fresh process (so its peak resident memory is its own) that
draws the seed workload (the notebook's distributions, Poisson at 30 req/s,
at most 32 sequences) with ``n`` requests and runs ``run_variant`` (model,
recorder, summary) for one policy. Prints the table and writes the figure.

    python benchmarks/scaling_figure.py [--sizes 10000 100000 1000000 10000000]
        [--out docs/img/scaling.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

POLICIES = {
    "continuous": {"policy": {"type": "continuous", "max_batch": 32}},
    "continuous, KV-limited": {"policy": {"type": "continuous", "max_batch": 32},
                               "memory": {"block_size": 16, "num_blocks": 2000}},
    "sarathi": {"policy": {"type": "sarathi", "max_batch": 32}},
    "priority + preemption": {"policy": {"type": "priority", "preempt": True,
                                         "max_batch": 32}},
    # vLLM's scheduler with its own 1,024 blocks of 16 tokens and prefix caching on
    "vllm-v1": {"policy": {"type": "vllm-v1", "max_num_seqs": 32}},
}

#: the largest size a policy runs at unless --all-sizes: vllm-v1 turns every arrival into
#: a request object with its block hashes when it arrives (as vLLM's scheduler does), and the
#: seed workload is overloaded, so its waiting queue (about 1 KB a request) grows with the run
LARGEST = {"vllm-v1": 1_000_000}

CHILD = """
import json, resource, sys, time
import orcasim
from orcasim.simulation import generate_workload, run_variant
n, over = int(sys.argv[1]), json.loads(sys.argv[2])
cfg = orcasim.load_scenario("seed_orca").override(
    {"workload.num_requests": n, "variants": None, **over}).variants[0]
arrays = generate_workload(cfg)
t0 = time.process_time()
res = run_variant(cfg, arrays)
cpu = time.process_time() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"steps": res.summary["num_steps"], "cpu": cpu, "rss": rss}))
"""


def measure(n: int, over: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), json.dumps(over)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+",
                    default=[10_000, 100_000, 1_000_000, 10_000_000])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent
                    / "docs" / "img" / "scaling.png")
    ap.add_argument("--all-sizes", action="store_true",
                    help="run every policy at every size (vllm-v1 at 10M needs ~10 GB)")
    args = ap.parse_args()
    rows = []
    print(f"{'policy':>24}  {'requests':>9}  {'steps':>9}  {'CPU s':>7}  {'steps/s':>9}  "
          f"{'peak RSS MB':>11}")
    for label, over in POLICIES.items():
        for n in args.sizes:
            if not args.all_sizes and n > LARGEST.get(label, n):
                continue
            m = measure(n, over)
            rate = m["steps"] / m["cpu"]
            rows.append((label, n, rate, m["rss"]))
            print(f"{label:>24}  {n:>9}  {int(m['steps']):>9}  {m['cpu']:>7.2f}  {rate:>9.0f}  "
                  f"{m['rss']:>11.0f}", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label in POLICIES:
        pts = [(n, r, m) for lab, n, r, m in rows if lab == label]
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        b.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
    for ax, ylabel in ((a, "simulated steps per CPU second"), (b, "peak resident memory (MB)")):
        ax.set_xscale("log")
        ax.set_xlabel("requests")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    a.set_yscale("log")
    a.legend(fontsize="small", loc="lower left")
    fig.suptitle("orcasim at scale: seed workload, 30 req/s, at most 32 sequences")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
