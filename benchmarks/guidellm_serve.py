"""guidellm against ``orcasim serve``, side by side with orcasim's offline simulation.

Starts ``orcasim serve SCENARIO`` on a free port, runs a constant-rate
guidellm benchmark against it, stops the server (SIGINT: it writes the
served run's ``requests.csv``), replays the served arrivals and lengths
offline (:func:`orcasim.serve.replay.replay`) and prints guidellm's TTFT and
inter-token latency next to the offline simulation's. The difference is what
HTTP and the client add.

guidellm is not in orcasim's ``test`` extra: it depends on torch,
transformers and datasets. Install it beside orcasim to run this:

    pip install guidellm
    python benchmarks/guidellm_serve.py [SCENARIO] --rate 5 --requests 300 \\
        --prompt-tokens 128 --output-tokens 64 --tokenizer PATH_OR_HF_NAME

``--tokenizer`` is what guidellm uses to build its synthetic prompts (a local
tokenizer directory, or a Hugging Face name it can download). Without
``guidellm`` on the PATH the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from orcasim.metrics.results import VariantResult
from orcasim.scenario import load_scenario
from orcasim.serve.replay import read_served, replay

DEFAULT_SCENARIO = {
    "name": "guidellm_serve",
    "seed": 0,
    "workload": {"type": "synthetic", "num_requests": 100,
                 "arrival": {"type": "poisson", "rate": 5.0},
                 "prompt_len": {"type": "fixed", "value": 128},
                 "output_len": {"type": "fixed", "value": 64}},
    "engine": {"latency": {"type": "linear", "base": 0.012, "per_seq": 0.0004,
                           "per_token": 0.00002}},
    "policy": {"type": "continuous", "max_batch": 64, "prefill": True},
}


def find_metric(obj: Any, name: str) -> dict | None:
    """The first ``{name: {...}}`` entry anywhere in guidellm's JSON report."""
    if isinstance(obj, dict):
        if isinstance(obj.get(name), dict):
            return obj[name]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = find_metric(v, name)
            if found is not None:
                return found
    return None


def stats_ms(m: dict | None) -> dict[str, float]:
    """mean / median / p99 (ms) of a guidellm metric (its ``successful`` requests)."""
    if m is None:
        return {}
    m = m.get("successful", m)
    pct = m.get("percentiles", {})
    return {"mean": m.get("mean", np.nan), "median": m.get("median", pct.get("p50", np.nan)),
            "p99": pct.get("p99", np.nan)}


def offline_ms(res: VariantResult) -> dict[str, dict[str, float]]:
    s = res.summary
    return {"ttft": {q: s[f"ttft_{k}"] * 1e3 for q, k in
                     (("mean", "mean"), ("median", "p50"), ("p99", "p99"))},
            "itl": {q: s[f"itl_{k}"] * 1e3 for q, k in
                    (("mean", "mean"), ("median", "p50"), ("p99", "p99"))}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=None)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default="gpt2")
    args = ap.parse_args()
    guidellm = shutil.which("guidellm")
    if guidellm is None:
        print("guidellm is not installed: pip install guidellm (it needs torch)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        scenario = args.scenario
        if scenario is None:
            scenario = str(Path(tmp) / "guidellm_serve.yaml")
            Path(scenario).write_text(json.dumps(DEFAULT_SCENARIO))
        sc = load_scenario(scenario)
        out = Path(tmp) / "served"
        server = subprocess.Popen(
            [sys.executable, "-m", "orcasim", "serve", scenario, "--port", "0", "--out",
             str(out), "--no-plots"], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "MPLBACKEND": "Agg"})
        line = server.stdout.readline()
        url = next(w for w in line.split() if w.startswith("http://"))
        report = Path(tmp) / "benchmarks.json"
        cmd = [guidellm, "run",
               "--backend", f"kind=openai_http,target={url}",
               "--profile", f"kind=constant,rate={args.rate:g}",
               "--constraint", f"kind=max_requests,count={args.requests}",
               "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                         f"output_tokens={args.output_tokens}",
               "--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}",
               "--output", f"kind=json,path={report}"]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, check=False)
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=300)
        if done.returncode != 0 or not report.exists():
            print(f"guidellm failed (status {done.returncode})", file=sys.stderr)
            return 1
        served = read_served(out / "requests.csv")
        offline = offline_ms(replay(sc.variants[0], served))
        data = json.loads(report.read_text())
        measured = {"ttft": stats_ms(find_metric(data, "time_to_first_token_ms")),
                    "itl": stats_ms(find_metric(data, "inter_token_latency_ms"))}
        print(f"\n{'metric':<8} {'stat':<7} {'guidellm ms':>12} {'offline ms':>11} "
              f"{'difference':>11}")
        for metric in ("ttft", "itl"):
            for q in ("mean", "median", "p99"):
                g, o = measured[metric].get(q, np.nan), offline[metric][q]
                print(f"{metric:<8} {q:<7} {g:12.2f} {o:11.2f} {g - o:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
