"""CPU time of every policy, with and without KV memory, against continuous batching.

Same requests and latency model as ``bench_core.py`` (the notebook's
workload, Poisson at 30 req/s, 32 sequences at most), each policy run three
ways: no memory section, an ample paged pool (100,000 blocks of 16 tokens,
never binding) and a tight one (400 blocks: admission refused and running
requests preempted). Prints, per policy and memory, the median CPU time (of
this process: other load on the machine counts less than in wall time), the
ratio to ``continuous`` without memory (run in the same process, the
baseline), the CPU time per engine step and its ratio to the baseline's
(policies take different numbers of steps on the same requests), and the
preemptions.

With ``--per-step`` each policy also runs with the engine's fast paths off
(``Engine.fast_paths = False``: one event per step and per arrival), and the
last column is that time over the default's: the speed-up from running
unchanged decode steps in one event, measured in the same process.

    python benchmarks/bench_policies.py [--requests 5000] [--repeat 3]
        [--policies sarathi srpt] [--memory none] [--per-step]
"""

from __future__ import annotations

import argparse
import statistics
import time

import orcasim
from orcasim.engine import Engine
from orcasim.simulation import generate_workload, run_variant

POLICIES = {
    "continuous": {"type": "continuous"},
    "fcfs": {"type": "fcfs"},
    "sarathi": {"type": "sarathi"},
    "prefill-first": {"type": "prefill-first"},
    "decode-first": {"type": "decode-first"},
    "priority+preempt": {"type": "priority", "preempt": True},
    "srpt": {"type": "srpt"},
    "sjf": {"type": "sjf"},
    "edf": {"type": "edf"},
    "vtc": {"type": "vtc"},
    "class-share": {"type": "class-share"},
    "vllm-v1": {"type": "vllm-v1", "max_num_seqs": 32, "enable_prefix_caching": False},
}
MEMORY = {"none": None,
          "ample": {"block_size": 16, "num_blocks": 100_000},
          "tight": {"block_size": 16, "num_blocks": 400}}


def timed(cfg: object, arrays: object, repeat: int) -> tuple[float, dict]:
    """Median CPU seconds of ``run_variant`` and the last run's summary."""
    times = []
    summary: dict = {}
    for _ in range(repeat):
        t0 = time.process_time()
        res = run_variant(cfg, arrays)  # type: ignore[arg-type]
        times.append(time.process_time() - t0)
        summary = res.summary
    return statistics.median(times), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--memory", nargs="+", default=list(MEMORY), choices=list(MEMORY))
    ap.add_argument("--per-step", action="store_true",
                    help="also time each policy with Engine.fast_paths = False")
    args = ap.parse_args()
    base = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": args.requests, "workload.arrival.rate": 30.0, "variants": None,
         "policy": {"type": "continuous", "max_batch": 32}})
    arrays = generate_workload(base.variants[0])
    ref, s0 = timed(base.variants[0], arrays, args.repeat)
    ref_step = ref / s0["num_steps"]
    print(f"{args.requests} requests; baseline continuous without memory: {ref:.3f} s CPU, "
          f"{1e6 * ref_step:.2f} us/step")
    print(f"{'policy':>17}  {'memory':>6}  {'cpu s':>7}  {'ratio':>6}  {'us/step':>8}  "
          f"{'step ratio':>10}  {'preemptions':>11}" + ("  per-step/default" if args.per_step
                                                          else ""))
    for name in args.policies:
        policy = POLICIES[name]
        for mem in args.memory:
            section = MEMORY[mem]
            over: dict = {"policy": policy}
            if "max_num_seqs" not in policy:
                over["policy"] = {**policy, "max_batch": 32}
            if section is not None:
                over["memory"] = section
            cfg = base.override(over).variants[0]
            secs, s = timed(cfg, arrays, args.repeat)
            step = secs / s["num_steps"]
            extra = ""
            if args.per_step:
                Engine.fast_paths = False
                try:
                    slow, s2 = timed(cfg, arrays, args.repeat)
                finally:
                    Engine.fast_paths = True
                assert s2["e2e_p99"] == s["e2e_p99"], "fast paths changed the results"
                extra = f"  {slow / secs:>16.2f}"
            print(f"{name:>17}  {mem:>6}  {secs:>7.3f}  {secs / ref:>6.2f}  "
                  f"{1e6 * step:>8.2f}  {step / ref_step:>10.2f}  "
                  f"{int(s['num_preemptions']):>11}{extra}", flush=True)


if __name__ == "__main__":
    main()
