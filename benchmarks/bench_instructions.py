"""Instructions per simulated step of each policy against continuous batching, under callgrind.

CPU time on a shared machine moves by tens of percent from run to run;
instruction counts do not. Each policy and memory section of
``bench_policies.py`` is simulated in a child process under
``valgrind --tool=callgrind`` at two request counts, and the difference of
the instructions over the difference of the engine steps is the cost per
step with every fixed cost (interpreter start, imports, drawing the
workload, building the model) cancelled. The ratio is over ``continuous``
without memory, measured the same way in the same invocation.

    python benchmarks/bench_instructions.py [--requests 5000 20000]
        [--policies continuous fcfs] [--memory none ample tight]

Needs ``valgrind`` on the PATH; callgrind runs Python about 50 times slower,
so keep the request counts small (the defaults take a few minutes per
policy and memory section).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(policy: str, memory: str, requests: int) -> None:
    """Simulate one configuration and print its engine steps (runs under callgrind)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_policies import MEMORY, POLICIES

    import orcasim
    from orcasim.simulation import generate_workload, run_variant

    base = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": requests, "workload.arrival.rate": 30.0, "variants": None,
         "policy": {"type": "continuous", "max_batch": 32}})
    spec = POLICIES[policy]
    over: dict = {"policy": spec if "max_num_seqs" in spec else {**spec, "max_batch": 32}}
    if MEMORY[memory] is not None:
        over["memory"] = MEMORY[memory]
    cfg = base.override(over).variants[0]
    arrays = generate_workload(cfg)
    # A full collection scans every object alive: the interpreter's, the imports' and the
    # run's. When one falls in a run depends on how many objects the process made before it
    # (compiling the sources or reading cached bytecode makes different numbers), and one
    # more or less in one of the two runs moves the difference by about 20 million
    # instructions. Collected and frozen here, what came before the run is never scanned
    # again and the collector's counters start from zero: the runs' collections are those
    # of their own objects.
    gc.collect()
    gc.freeze()
    res = run_variant(cfg, arrays)
    print(f"steps {int(res.summary['num_steps'])} preemptions "
          f"{int(res.summary['num_preemptions'])}")


def count(policy: str, memory: str, requests: int) -> tuple[int, int, int]:
    """Instructions, engine steps and preemptions of one child run under callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, os.path.abspath(__file__), "--child", policy, memory, str(requests)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output: {out.stderr[-300:]}")
    words = out.stdout.split()
    return int(found.group(1)), int(words[1]), int(words[3])


def per_step(policy: str, memory: str, sizes: list[int]) -> tuple[float, int]:
    """Instructions per step between the two request counts, and the larger run's preemptions."""
    (i0, s0, _), (i1, s1, pre) = (count(policy, memory, n) for n in sizes)
    return (i1 - i0) / (s1 - s0), pre


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_policies import MEMORY, POLICIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs=2, default=[5000, 20000])
    ap.add_argument("--policies", nargs="+", default=["continuous"], choices=list(POLICIES))
    ap.add_argument("--memory", nargs="+", default=["none"], choices=list(MEMORY))
    args = ap.parse_args()
    base, _ = per_step("continuous", "none", args.requests)
    print(f"requests {args.requests[0]} -> {args.requests[1]}; continuous without memory: "
          f"{base / 1e3:.2f} k instructions per step")
    print(f"{'policy':>17}  {'memory':>6}  {'k instr/step':>12}  {'ratio':>6}  {'preemptions':>11}")
    for name in args.policies:
        for mem in args.memory:
            instr, pre = per_step(name, mem, args.requests)
            print(f"{name:>17}  {mem:>6}  {instr / 1e3:>12.2f}  {instr / base:>6.2f}  {pre:>11}",
                  flush=True)


if __name__ == "__main__":
    main()
