"""A load tool against ``orcasim serve``, side by side with orcasim's offline simulation.

Starts ``orcasim serve SCENARIO`` on a free port (a subprocess), sends a
constant-rate benchmark of ``--requests`` streamed requests (``--prompt-tokens``
prompt tokens, exactly ``--output-tokens`` output tokens with ``ignore_eos``),
stops the server (SIGINT: it writes the served run's ``requests.csv``),
replays the served arrivals and lengths offline
(:func:`orcasim.serve.replay.replay`) and prints the client's TTFT and
inter-token latency next to the offline simulation's, computed the same way
(numpy's percentiles over requests). Inter-token latency is per request, as
guidellm defines it: (last token - first token) / (tokens - 1); the offline
column is orcasim's ``tpot``. Each measured request is paired with its served
request by the response id (``cmpl-N`` is the served run's request ``N``): the
per-request differences, client minus offline, are what HTTP and the client
add, and their median and p99 are printed as the HTTP overhead.

Two clients:

- ``--client openai`` (runs with orcasim's test dependencies): the ``openai``
  package, one asyncio task per request;
- ``--client guidellm`` (the default): guidellm, the vLLM project's benchmark
  tool, unmodified (``guidellm run`` with a constant-rate profile and
  synthetic prompts, on ``/v1/completions``). It depends on torch,
  transformers and datasets, so it is not in orcasim's ``test`` extra;
  install it beside orcasim. Its synthetic prompts are cut to exactly
  ``--prompt-tokens`` tokens of a tokenizer, and the server counts them with
  the same one (``orcasim serve --tokenizer``). ``--tokenizer DIR`` is a
  local tokenizer directory (a ``tokenizer.json`` that transformers loads);
  without it a byte-level BPE tokenizer is trained on orcasim's docs
  (:func:`build_tokenizer`, well under a second), so nothing is downloaded.
  guidellm's worker processes: ``--workers`` (default 2). Besides the
  comparison, guidellm's own reported median and p99 are printed.

    python benchmarks/serve_vs_offline.py --client openai --rate 20 --requests 300
    pip install guidellm
    python benchmarks/serve_vs_offline.py --client guidellm --rate 20 --requests 300

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
import pandas as pd

from orcasim.scenario import load_scenario
from orcasim.serve.replay import read_served, replay

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = {
    "name": "serve_vs_offline",
    "seed": 0,
    "workload": {"type": "synthetic", "num_requests": 100,
                 "arrival": {"type": "poisson", "rate": 5.0},
                 "prompt_len": {"type": "fixed", "value": 128},
                 "output_len": {"type": "fixed", "value": 64}},
    # at 20 requests/s of 64 tokens: some 30 in flight, 25 ms steps (measured): loaded, stable
    "engine": {"latency": {"type": "linear", "base": 0.012, "per_seq": 0.0001,
                           "per_token": 0.000002}},
    "policy": {"type": "continuous", "max_batch": 64, "prefill": True},
}
STATS = ("mean", "median", "p99")
#: per request: served request id -> (TTFT ms, inter-token latency ms, wall clock (Unix s)
#: when the request was sent, wall clock when its first token was read)
Measured = dict[int, tuple[float, float, float, float]]


def build_tokenizer(out: Path, vocab_size: int = 4000) -> Path:
    """A byte-level BPE tokenizer trained on orcasim's docs, saved in ``out`` as
    ``tokenizer.json`` plus the ``tokenizer_config.json`` that lets transformers'
    ``AutoTokenizer`` load the directory offline. Byte-level: any text encodes; and on
    ASCII prose like guidellm's synthetic prompts (words, single spaces and newlines) decoding
    the first ``n`` tokens of a text gives a text of exactly ``n`` tokens, so the prompt
    lengths guidellm asks for are the lengths the server counts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


def served_id(response_id: str) -> int:
    """The served request of a response id (``cmpl-12`` or ``chatcmpl-12``: request 12)."""
    return int(response_id.rsplit("-", 1)[1])


def guidellm_measured(report: dict) -> Measured:
    """Per-request TTFT, inter-token latency (ms) and send and first-token times of the
    successful requests in a guidellm JSON report (its first benchmark)."""
    out = {}
    for r in report["benchmarks"][0]["requests"]["successful"]:
        t = r["info"]["timings"]
        out[served_id(r["response_id"])] = (
            float(r["time_to_first_token_ms"]), float(r["inter_token_latency_ms"]),
            float(t["request_start"]), float(t["first_token_iteration"]))
    return out


def guidellm_reported(report: dict) -> dict[str, dict[str, float]]:
    """guidellm's own mean, median and p99 (ms) of TTFT and inter-token latency."""
    m = report["benchmarks"][0]["metrics"]
    out = {}
    for key, name in (("ttft", "time_to_first_token_ms"), ("itl", "inter_token_latency_ms")):
        ok = m[name]["successful"]
        out[key] = {"mean": ok["mean"], "median": ok["median"], "p99": ok["percentiles"]["p99"]}
    return out


def sample_stats(values_ms: np.ndarray) -> dict[str, float]:
    """mean, median and p99 (numpy's linear percentile) of per-request values."""
    return {"mean": float(values_ms.mean()), "median": float(np.median(values_ms)),
            "p99": float(np.percentile(values_ms, 99))}


def compare(measured: Measured, offline: Any, start_unix: float) -> dict[str, Any]:
    """The measured requests next to the same requests offline.

    ``offline``: the replay's per-request table (``VariantResult.requests``);
    ``start_unix``: the served run's wall clock at simulated time 0. Returns ``{"n",
    "client", "offline", "overhead"}``: for ``ttft`` and ``itl``, the stats of the
    client's values, of the offline values of the same requests, and of the per-request
    differences (client minus offline); and in ``overhead`` also the two halves of the
    TTFT difference: ``request`` (sent by the client -> arrived in the simulation) and
    ``response`` (first token in the simulation -> read by the client).
    """
    ids = np.array(sorted(measured), dtype=np.int64)
    client = np.array([measured[i] for i in ids]).reshape(-1, 4)
    table = offline.set_index("id").loc[ids]
    off = np.column_stack([table["ttft"], table["tpot"]]) * 1e3
    out: dict[str, Any] = {"n": len(ids), "client": {}, "offline": {}, "overhead": {}}
    for j, metric in enumerate(("ttft", "itl")):
        out["client"][metric] = sample_stats(client[:, j])
        out["offline"][metric] = sample_stats(off[:, j])
        out["overhead"][metric] = sample_stats(client[:, j] - off[:, j])
    arrived = start_unix + table["arrival"].to_numpy()
    first = start_unix + table["first_token"].to_numpy()
    out["overhead"]["request"] = sample_stats((arrived - client[:, 2]) * 1e3)
    out["overhead"]["response"] = sample_stats((client[:, 3] - first) * 1e3)
    return out


async def openai_load(url: str, model: str, rate: float, n: int, prompt_tokens: int,
                      output_tokens: int) -> Measured:
    """TTFT and per-request inter-token latency (ms) of ``n`` requests at ``rate``/s."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    t_start = time.perf_counter()

    async def one(i: int) -> tuple[int, tuple[float, float, float, float]]:
        await asyncio.sleep(max(0.0, t_start + i / rate - time.perf_counter()))
        sent, t0 = time.time(), time.perf_counter()
        stream = await client.completions.create(
            model=model, prompt="x" * (4 * prompt_tokens), max_tokens=output_tokens,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        times, rid, first = [], "", 0.0
        async for c in stream:
            rid = c.id
            if c.choices:
                times.append(time.perf_counter() - t0)
                first = first or time.time()
        itl = (times[-1] - times[0]) / max(1, len(times) - 1)
        return served_id(rid), (times[0] * 1e3, itl * 1e3, sent, first)

    out = await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()
    return dict(out)


def guidellm_command(url: str, args: argparse.Namespace, tokenizer: Path,
                     report: Path) -> list[str]:
    """``guidellm run``: a constant-rate benchmark of synthetic prompts on
    ``/v1/completions`` (no chat template: the prompt is exactly the tokens asked for)."""
    return [shutil.which("guidellm") or "guidellm", "run",
            "--backend", f"kind=openai_http,target={url},request_format=/v1/completions",
            "--profile", f"kind=constant,rate={args.rate:g}",
            "--constraint", f"kind=max_requests,count={args.requests}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                      f"output_tokens={args.output_tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--output", f"kind=json,path={report}",
            "--disable-console-interactive"]


def run_guidellm(url: str, args: argparse.Namespace, tokenizer: Path,
                 tmp: Path) -> dict | None:
    """guidellm's JSON report of the benchmark, or None if it failed."""
    report = tmp / "benchmarks.json"
    cmd = guidellm_command(url, args, tokenizer, report)
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "GUIDELLM__MAX_WORKER_PROCESSES": str(args.workers),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, check=False, env=env)
    if done.returncode != 0 or not report.exists():
        print(f"guidellm failed (status {done.returncode})", file=sys.stderr)
        return None
    return json.loads(report.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=None)
    ap.add_argument("--client", choices=["guidellm", "openai"], default="guidellm")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="a local tokenizer directory (default: one trained on the docs)")
    ap.add_argument("--workers", type=int, default=2, help="guidellm's worker processes")
    args = ap.parse_args()
    if args.client == "guidellm" and shutil.which("guidellm") is None:
        print("guidellm is not installed: pip install guidellm (it needs torch)", file=sys.stderr)
        return 2
    report = None
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        scenario = args.scenario
        if scenario is None:
            scenario = str(tmp / "serve_vs_offline.yaml")
            Path(scenario).write_text(json.dumps(DEFAULT_SCENARIO))
        sc = load_scenario(scenario)
        out = tmp / "served"
        serve = [sys.executable, "-m", "orcasim", "serve", scenario, "--port", "0", "--out",
                 str(out), "--no-plots", "--model", "sim"]
        tokenizer = None
        if args.client == "guidellm":
            tokenizer = args.tokenizer or build_tokenizer(tmp / "tokenizer")
            serve += ["--tokenizer", str(tokenizer / "tokenizer.json")]
        server = subprocess.Popen(serve, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "MPLBACKEND": "Agg"})
        line = server.stdout.readline()
        url = next(w for w in line.split() if w.startswith("http://"))
        if args.client == "openai":
            measured = asyncio.run(openai_load(url, "sim", args.rate, args.requests,
                                               args.prompt_tokens, args.output_tokens))
        else:
            report = run_guidellm(url, args, tokenizer, tmp)
            measured = None if report is None else guidellm_measured(report)
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=300)
        if measured is None:
            return 1
        served_columns = read_served(out / "requests.csv")
        summary = json.loads((out / "summary.json").read_text())["variants"]
        lag = next(iter(summary.values()))
        offline = replay(sc.variants[0], served_columns).requests
        served = pd.read_csv(out / "requests.csv")
    same = int(sum(np.array_equal(served[c].to_numpy(), offline[c].to_numpy(), equal_nan=True)
                   for c in ("first_token", "finish")))
    res = compare(measured, offline, lag["served_start_unix"])
    n_prompt = np.unique(served["prompt_len"]).tolist()
    print(f"{args.client}: {res['n']} of {args.requests} requests at {args.rate:g}/s, "
          f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens (served prompt "
          f"lengths {n_prompt}); server lag p99 {lag['realtime_lag_p99'] * 1e3:.2f} ms; served "
          f"schedule {'equals' if same == 2 else 'differs from'} the offline replay")
    print(f"{'metric':<6} {'stat':<7} {args.client + ' ms':>12} {'offline ms':>11} "
          f"{'difference':>11}")
    for metric in ("ttft", "itl"):
        for q in STATS:
            g, o = res["client"][metric][q], res["offline"][metric][q]
            print(f"{metric:<6} {q:<7} {g:12.2f} {o:11.2f} {g - o:11.2f}")
    for key, what in (("ttft", f"TTFT, {args.client} - offline"),
                      ("request", "  request: sent -> arrived in the simulation"),
                      ("response", "  response: first token simulated -> read"),
                      ("itl", f"inter-token latency, {args.client} - offline")):
        d = res["overhead"][key]
        print(f"per request, {what}: median {d['median']:.2f} ms, p99 {d['p99']:.2f} ms, "
              f"mean {d['mean']:.2f} ms")
    if report is not None:
        rep = guidellm_reported(report)
        print("guidellm's own report: " + "; ".join(
            f"{m} median {rep[m]['median']:.2f} ms, p99 {rep[m]['p99']:.2f} ms"
            for m in ("ttft", "itl")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
