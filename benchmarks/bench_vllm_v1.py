"""Time per step of the vllm-v1 policy against vLLM's own scheduler loop (the oracle harness).

For every golden workload (tests/golden/vllm_v1) this runs orcasim's step-clock
trace (SimPy engine, policy, cache manager, trace lines: the whole run) and
reads the harness's ``ms_per_step`` from the golden trace's summary line (its
loop around vLLM's ``schedule()`` and ``update_from_output()``, measured when the
golden file was written). Both divide by the steps that scheduled tokens.
Prints ms/step for each workload, the ratio orcasim / harness, and totals.

With ``--cpu`` orcasim's time is the process's CPU time, the least of the
repeats (for a shared machine, where wall time counts other processes'
work); the harness's figure stays its wall time on its own machine. With
``--large`` it also runs a 5,000-request Poisson scenario under memory
pressure in simulated time and prints its ms per step.

    python benchmarks/bench_vllm_v1.py [--repeat 5] [--cpu] [--large]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import orcasim
from orcasim.steptrace import load_workload, read_trace, run_trace

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "vllm_v1"


def bench_golden(repeat: int, cpu: bool = False) -> None:
    clock = time.process_time if cpu else time.perf_counter
    pick = min if cpu else statistics.median
    rows = []
    for trace in sorted(GOLDEN.glob("*.trace.jsonl")):
        name = trace.name.removesuffix(".trace.jsonl")
        _, ref = read_trace(trace)
        assert ref is not None
        workload = load_workload(GOLDEN / f"{name}.json")
        times = []
        for _ in range(repeat):
            t0 = clock()
            _, summary = run_trace(workload)
            times.append(clock() - t0)
        steps = summary["num_engine_steps"]
        ours = 1000 * pick(times) / steps
        rows.append((name, steps, ours, ref["ms_per_step"], ref["loop_wall_s"]))
    print(f"orcasim: {'least CPU time' if cpu else 'median wall time'} of {repeat} runs")
    print(f"{'workload':<36} {'steps':>6} {'orcasim ms/step':>16} {'vLLM ms/step':>13} "
          f"{'ratio':>6}")
    for name, steps, ours, theirs, _ in rows:
        print(f"{name:<36} {steps:>6} {ours:>16.4f} {theirs:>13.4f} {ours / theirs:>6.2f}")
    steps = sum(r[1] for r in rows)
    ours_s = sum(r[1] * r[2] for r in rows) / 1000
    theirs_s = sum(r[4] for r in rows)
    print(f"\n{len(rows)} workloads, {steps} steps: orcasim {1000 * ours_s / steps:.4f} ms/step, "
          f"vLLM harness {1000 * theirs_s / steps:.4f} ms/step, ratio {ours_s / theirs_s:.2f} "
          f"(median of per-workload ratios {statistics.median(r[2] / r[3] for r in rows):.2f})")


def bench_large(repeat: int) -> None:
    sc = orcasim.Scenario({
        "workload": {"type": "synthetic", "num_requests": 5000,
                     "arrival": {"type": "poisson", "rate": 25.0},
                     "prompt_len": {"type": "uniform", "low": 100, "high": 1500},
                     "output_len": {"type": "uniform", "low": 20, "high": 400}},
        "engine": {"latency": {"type": "linear", "per_prefill_token": 0.00005}},
        "policy": {"type": "vllm-v1", "num_blocks": 2000},
        "variants": {"sync": {}, "async": {"policy.async_scheduling": True}},
    })
    for variant in sc.variants:
        times, res = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            res = orcasim.simulate(sc, seed=1, variants=[variant.name])
            times.append(time.perf_counter() - t0)
        s = res[variant.name].summary
        steps = int(s["num_steps"])
        print(f"large ({variant.name}): 5000 requests, {steps} steps, mean batch "
              f"{s['mean_batch_size']:.1f}, {1000 * statistics.median(times) / steps:.4f} ms/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpu", action="store_true",
                    help="orcasim's CPU time (least of the repeats) instead of its wall time")
    ap.add_argument("--large", action="store_true")
    a = ap.parse_args()
    bench_golden(a.repeat, a.cpu)
    if a.large:
        print()
        bench_large(max(1, a.repeat // 2))


if __name__ == "__main__":
    main()
