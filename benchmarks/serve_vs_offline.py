"""A load tool against ``orcasim serve``, side by side with orcasim's offline simulation.

Starts ``orcasim serve SCENARIO`` on a free port (a subprocess), sends a
constant-rate benchmark of ``--requests`` streamed requests (``--prompt-tokens``
prompt tokens, exactly ``--output-tokens`` output tokens with ``ignore_eos``),
stops the server (SIGINT: it writes the served run's ``requests.csv``),
replays the served arrivals and lengths offline
(:func:`orcasim.serve.replay.replay`) and prints the client's TTFT and
inter-token latency next to the offline simulation's. The difference is what
HTTP and the client add. Inter-token latency is per request, as guidellm
defines it: (last token - first token) / (tokens - 1); the offline column is
orcasim's ``tpot``.

Two clients:

- ``--client openai`` (runs with orcasim's test dependencies): the ``openai``
  package, one asyncio task per request;
- ``--client guidellm`` (the default): guidellm, the vLLM project's benchmark
  tool. It depends on torch, transformers and datasets, so it is not in
  orcasim's ``test`` extra; install it beside orcasim. ``--tokenizer`` is the
  tokenizer guidellm builds its synthetic prompts with (a local directory, or
  a Hugging Face name it can download).

    python benchmarks/serve_vs_offline.py --client openai --rate 20 --requests 300
    pip install guidellm
    python benchmarks/serve_vs_offline.py --client guidellm --rate 20 --requests 300 \\
        --tokenizer gpt2

Without guidellm on the PATH, ``--client guidellm`` says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from orcasim.metrics.results import VariantResult
from orcasim.scenario import load_scenario
from orcasim.serve.replay import read_served, replay

DEFAULT_SCENARIO = {
    "name": "serve_vs_offline",
    "seed": 0,
    "workload": {"type": "synthetic", "num_requests": 100,
                 "arrival": {"type": "poisson", "rate": 5.0},
                 "prompt_len": {"type": "fixed", "value": 128},
                 "output_len": {"type": "fixed", "value": 64}},
    # about 20 ms a step at 20 requests/s of 64 tokens (some 26 running): loaded, stable
    "engine": {"latency": {"type": "linear", "base": 0.012, "per_seq": 0.0001,
                           "per_token": 0.000002}},
    "policy": {"type": "continuous", "max_batch": 64, "prefill": True},
}
STATS = (("mean", "mean"), ("median", "p50"), ("p99", "p99"))


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


def guidellm_stats(m: dict | None) -> dict[str, float]:
    """mean / median / p99 (ms) of a guidellm metric (its ``successful`` requests)."""
    if m is None:
        return {}
    m = m.get("successful", m)
    pct = m.get("percentiles", {})
    return {"mean": m.get("mean", np.nan), "median": m.get("median", pct.get("p50", np.nan)),
            "p99": pct.get("p99", np.nan)}


def sample_stats(values_ms: np.ndarray) -> dict[str, float]:
    return {"mean": float(values_ms.mean()), "median": float(np.median(values_ms)),
            "p99": float(np.percentile(values_ms, 99))}


def offline_ms(res: VariantResult) -> dict[str, dict[str, float]]:
    s = res.summary
    return {"ttft": {q: s[f"ttft_{k}"] * 1e3 for q, k in STATS},
            "itl": {q: s[f"tpot_{k}"] * 1e3 for q, k in STATS}}


async def openai_load(url: str, model: str, rate: float, n: int, prompt_tokens: int,
                      output_tokens: int) -> dict[str, dict[str, float]]:
    """TTFT and per-request inter-token latency (ms) of ``n`` requests at ``rate``/s."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    t_start = time.perf_counter()

    async def one(i: int) -> tuple[float, float]:
        await asyncio.sleep(max(0.0, t_start + i / rate - time.perf_counter()))
        t0 = time.perf_counter()
        stream = await client.completions.create(
            model=model, prompt="x" * (4 * prompt_tokens), max_tokens=output_tokens,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        times = [time.perf_counter() - t0 async for c in stream if c.choices]
        return times[0], (times[-1] - times[0]) / max(1, len(times) - 1)

    out = np.array(await asyncio.gather(*(one(i) for i in range(n)))) * 1e3
    await client.close()
    return {"ttft": sample_stats(out[:, 0]), "itl": sample_stats(out[:, 1])}


def run_guidellm(url: str, args: argparse.Namespace, tmp: Path) -> dict | None:
    report = tmp / "benchmarks.json"
    cmd = [shutil.which("guidellm") or "guidellm", "run",
           "--backend", f"kind=openai_http,target={url}",
           "--profile", f"kind=constant,rate={args.rate:g}",
           "--constraint", f"kind=max_requests,count={args.requests}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                     f"output_tokens={args.output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}",
           "--output", f"kind=json,path={report}"]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0 or not report.exists():
        print(f"guidellm failed (status {done.returncode})", file=sys.stderr)
        return None
    data = json.loads(report.read_text())
    return {"ttft": guidellm_stats(find_metric(data, "time_to_first_token_ms")),
            "itl": guidellm_stats(find_metric(data, "inter_token_latency_ms"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=None)
    ap.add_argument("--client", choices=["guidellm", "openai"], default="guidellm")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default="gpt2")
    args = ap.parse_args()
    if args.client == "guidellm" and shutil.which("guidellm") is None:
        print("guidellm is not installed: pip install guidellm (it needs torch)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        scenario = args.scenario
        if scenario is None:
            scenario = str(tmp / "serve_vs_offline.yaml")
            Path(scenario).write_text(json.dumps(DEFAULT_SCENARIO))
        sc = load_scenario(scenario)
        out = tmp / "served"
        server = subprocess.Popen(
            [sys.executable, "-m", "orcasim", "serve", scenario, "--port", "0", "--out",
             str(out), "--no-plots", "--model", "sim"], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "MPLBACKEND": "Agg"})
        line = server.stdout.readline()
        url = next(w for w in line.split() if w.startswith("http://"))
        if args.client == "openai":
            measured = asyncio.run(openai_load(url, "sim", args.rate, args.requests,
                                               args.prompt_tokens, args.output_tokens))
        else:
            measured = run_guidellm(url, args, tmp)
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=300)
        if measured is None:
            return 1
        served = read_served(out / "requests.csv")
        summary = json.loads((out / "summary.json").read_text())["variants"]
        lag = next(iter(summary.values()))
        offline = offline_ms(replay(sc.variants[0], served))
    print(f"{args.client}: {args.requests} requests at {args.rate:g}/s, "
          f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens; server lag p99 "
          f"{lag['realtime_lag_p99'] * 1e3:.2f} ms")
    print(f"{'metric':<6} {'stat':<7} {args.client + ' ms':>12} {'offline ms':>11} "
          f"{'difference':>11}")
    for metric in ("ttft", "itl"):
        for q in ("mean", "median", "p99"):
            g, o = measured[metric].get(q, np.nan), offline[metric][q]
            print(f"{metric:<6} {q:<7} {g:12.2f} {o:11.2f} {g - o:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
