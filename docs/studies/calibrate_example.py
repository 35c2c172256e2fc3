"""The measured-steps file of docs/latency.md's calibrate example.

Writes 15 steps drawn from a roofline (Llama-2-7B on an A100-80GB, 55 %
compute and 75 % bandwidth efficiency, 2 ms overhead) with 3 % noise:

    python docs/studies/calibrate_example.py steps.csv
    orcasim calibrate steps.csv --model roofline
"""

from __future__ import annotations

import sys

import numpy as np

from orcasim.latency.roofline import RooflineLatency, RooflineParams
from orcasim.plan import StepPlan


def write_steps(path: str, seed: int = 1) -> None:
    truth = RooflineLatency(RooflineParams(compute_efficiency=0.55, bandwidth_efficiency=0.75,
                                           overhead=0.002))
    rng = np.random.default_rng(seed)
    steps = [StepPlan(b, b * c) for b in (1, 4, 16, 64) for c in (256, 1024, 4096)]
    steps += [StepPlan(1, 0, n, 0) for n in (256, 1024, 4096)]
    rows = ["batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds"]
    for s in steps:
        t = truth.step_time(s) * (1 + 0.03 * rng.standard_normal())
        rows.append(f"{s.num_seqs},{s.num_prefill_tokens},{s.num_decode_tokens},"
                    f"{s.num_kv_tokens},{t:.6f}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    write_steps(sys.argv[1] if len(sys.argv) > 1 else "steps.csv")
