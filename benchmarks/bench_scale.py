"""Continuous batching at scale: µs per simulated step against the notebook loop.

Both run in this process on the same requests (the seed notebook's
distributions, Poisson at 30 req/s, max_batch 32). The baseline is the
notebook's continuous loop with its ``pending.pop(0)`` replaced by a deque
(the original is quadratic in the number of requests). orcasim runs
``run_variant`` (SimPy model, recorder, full summary) twice: advancing runs of
unchanged-batch steps in one event (the default; for ``continuous`` without
memory limits the engine's loop over whole runs,
:class:`~orcasim.policies.decode_loop.FcfsDecodeLoop`), and one event per step
(``Engine.fast_paths = False``). Both must give the notebook's results.
Times are CPU seconds of the process.

    python benchmarks/bench_scale.py [--sizes 100000 1000000] [--no-per-step]
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np
from bench_core import load_notebook_loop

import orcasim
from orcasim.engine import Engine
from orcasim.simulation import run_variant
from orcasim.workload.base import WorkloadArrays


def continuous_deque(reqs, max_batch, step):
    """The notebook's continuous loop with a deque for its pending list."""
    pending = deque(reqs)
    active = []
    now = 0.0
    while pending or active:
        while pending and pending[0]["arrival"] <= now and len(active) < max_batch:
            r = pending.popleft()
            r["started_at"] = now
            active.append(r)
        if not active:
            now = pending[0]["arrival"]
            continue
        tot = sum(r["prompt_len"] + r["tokens_done"] for r in active)
        now += step(len(active), tot)
        for r in active:
            r["tokens_done"] += 1
        for r in active:
            if r["tokens_done"] >= r["output_len"]:
                r["finished_at"] = now
        active = [r for r in active if r["tokens_done"] < r["output_len"]]


def orcasim_run(cfg, arrays, fast_paths: bool) -> tuple[float, dict]:
    """CPU seconds of ``run_variant`` and its summary."""
    Engine.fast_paths = fast_paths
    try:
        t0 = time.process_time()
        res = run_variant(cfg, arrays)
        return time.process_time() - t0, res.summary
    finally:
        Engine.fast_paths = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--no-per-step", action="store_true", help="skip the one-event-per-step run")
    args = ap.parse_args()
    nb = load_notebook_loop()
    step = nb.lat((0.005, 0.0008, 0.00002))
    print(f"{'requests':>9}  {'steps':>9}  {'notebook µs/step':>16}  {'runs µs/step':>12}  "
          f"{'ratio':>6}  {'per-step µs/step':>16}  {'ratio':>6}")
    for n in args.sizes:
        reqs = nb.workload(n, 30.0, 0)
        arrays = WorkloadArrays(
            arrival=np.array([r["arrival"] for r in reqs]),
            prompt_len=np.array([r["prompt_len"] for r in reqs], dtype=np.int64),
            output_len=np.array([r["output_len"] for r in reqs], dtype=np.int64),
        )
        cfg = orcasim.load_scenario("seed_orca").override(
            {"workload.num_requests": n}).variant("continuous")
        t0 = time.process_time()
        continuous_deque(reqs, 32, step)
        ref = nb.summarise(reqs)
        t_nb = time.process_time() - t0
        del reqs
        t_fast, s = orcasim_run(cfg, arrays, True)
        assert s["e2e_p99"] == ref["e2e_p99"], "results differ from the notebook loop"
        steps = int(s["num_steps"])
        per = f"{'-':>16}  {'-':>6}"
        if not args.no_per_step:
            t_slow, s2 = orcasim_run(cfg, arrays, False)
            assert s2 == s or all(s2[k] == s[k] or (s2[k] != s2[k] and s[k] != s[k]) for k in s)
            per = f"{t_slow / steps * 1e6:>16.3f}  {t_slow / t_nb:>6.3f}"
        print(f"{n:>9}  {steps:>9}  {t_nb / steps * 1e6:>16.3f}  {t_fast / steps * 1e6:>12.3f}  "
              f"{t_fast / t_nb:>6.3f}  {per}", flush=True)


if __name__ == "__main__":
    main()
