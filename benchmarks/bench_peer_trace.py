"""The 50,000-request comparison trace: simulate + summary, and the whole ``orcasim run``.

Llama-2-7B on an A100-80GB (the ``roofline`` latency model's defaults),
at most 32 sequences, Poisson arrivals at 10 req/s, prompts
lognormal(4.0, 0.7) clipped to [5, 500] and outputs lognormal(4.6, 0.9)
clipped to [10, 2000] (the seed notebook's distributions). Prints the CPU
seconds of ``orcasim.simulate`` (with the summary) for ``continuous`` and
``vllm-v1`` on the same requests and their ratio, then the wall and CPU
seconds of ``orcasim run`` for ``continuous`` with every output and plot, in
a child process.

    python benchmarks/bench_peer_trace.py [--requests 50000] [--policies vllm-v1]
        [--simulate-only] [--gc-off]

Under callgrind (``PYTHONHASHSEED=0 valgrind --tool=callgrind
--callgrind-out-file=/dev/null python benchmarks/bench_peer_trace.py
--requests N --policies P --simulate-only --gc-off`` at two request counts), the
difference of the instructions over the difference of the requests is a
policy's cost per request with the fixed costs cancelled.
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
import tempfile
import time

import orcasim

OVERRIDES = {
    "workload.arrival.rate": 10.0,
    "engine.latency": {"type": "roofline", "model": "llama-2-7b", "gpu": "a100-80gb"},
    "variants": None,
}
POLICIES = {"continuous": {"type": "continuous", "max_batch": 32},
            "vllm-v1": {"type": "vllm-v1", "max_num_seqs": 32, "enable_prefix_caching": False}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES),
                    help="simulate only these (under callgrind: one policy's instructions)")
    ap.add_argument("--simulate-only", action="store_true", help="leave out `orcasim run`")
    ap.add_argument("--gc-off", action="store_true",
                    help="no cyclic garbage collection (under callgrind: its passes come at "
                    "allocation counts and move a run's instructions by tens of millions)")
    args = ap.parse_args()
    if args.gc_off:
        gc.disable()
    secs = {}
    for name in args.policies:
        policy = POLICIES[name]
        sc = orcasim.load_scenario("seed_orca").override(
            {"workload.num_requests": args.requests, **OVERRIDES, "policy": policy})
        t0 = time.process_time()
        res = orcasim.simulate(sc)
        secs[name] = time.process_time() - t0
        s = next(iter(res.values())).summary
        print(f"simulate + summary {name:>10}: {secs[name]:7.2f} s CPU  "
              f"({int(s['num_steps'])} steps, e2e_p99 {s['e2e_p99']:.6g})", flush=True)
    if len(secs) == len(POLICIES):
        print(f"vllm-v1 / continuous: {secs['vllm-v1'] / secs['continuous']:.2f}")
    if args.simulate_only:
        return
    sets = [f"--set=workload.num_requests={args.requests}", "--set=workload.arrival.rate=10.0",
            "--set=engine.latency={type: roofline, model: llama-2-7b, gpu: a100-80gb}",
            "--set=policy={type: continuous, max_batch: 32}", "--variant=continuous"]
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orcasim", "run", "seed_orca", *sets,
                        "--out", tmp], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"orcasim run continuous with plots: {wall:.2f} s wall, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
