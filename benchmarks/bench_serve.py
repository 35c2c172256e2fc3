"""Real-time lag of ``orcasim serve`` under load, and the highest request rate it keeps up with.

The server runs as a subprocess (``orcasim serve``, its own process and
core); this process drives it with a plain aiohttp client:

1. ``--streams`` (default 500) concurrent streaming completions of
   ``--tokens`` tokens each (``ignore_eos``), all open at once;
2. open-loop constant request rates (``--rates``), each for ``--seconds``,
   short streamed requests (100-character prompt, 16 tokens).

After each load the server is stopped with SIGINT and its ``summary.json``
gives the exact real-time lag (wall clock minus simulated time at every step
end and arrival): p50, p99 and max. A rate is *kept up with* when every
request succeeded, the client sent at the asked rate (within 5%) and the lag
p99 is under ``--max-lag`` (default 10 ms). Prints one line per load.

    python benchmarks/bench_serve.py [--streams 500] [--tokens 200]
        [--rates 50 100 200 400 800] [--seconds 5]

The numbers depend on the machine and its other load: both processes are
Python, and the client competes with the server for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

SCENARIO = {
    "name": "bench_serve",
    "seed": 0,
    "workload": {"type": "synthetic", "num_requests": 100,
                 "arrival": {"type": "poisson", "rate": 10.0},
                 "prompt_len": {"type": "fixed", "value": 100},
                 "output_len": {"type": "fixed", "value": 16}},
    # a step of 10 ms plus 40 us per sequence: 30 ms at 500 sequences
    "engine": {"latency": {"type": "linear", "base": 0.01, "per_seq": 0.00004,
                           "per_token": 0.0}},
    "policy": {"type": "continuous", "max_batch": 1024},
}


class Server:
    """``orcasim serve`` in a subprocess on a free port."""

    def __init__(self, workdir: Path) -> None:
        scenario = workdir / "bench_serve.yaml"
        scenario.write_text(json.dumps(SCENARIO))
        self.out = workdir / f"out-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orcasim", "serve", str(scenario), "--port", "0",
             "--out", str(self.out), "--no-plots"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MPLBACKEND": "Agg"})
        line = self.proc.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"the server did not start: {line}{self.proc.stderr.read()}")
        self.url = next(w for w in line.split() if w.startswith("http://"))

    def stop(self) -> dict:
        """SIGINT, wait, and the served run's summary."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=300)
        if self.proc.returncode != 0:
            raise SystemExit(f"the server failed: {err}")
        return json.loads((self.out / "summary.json").read_text())["variants"]["continuous"]


async def stream(session: aiohttp.ClientSession, url: str, tokens: int) -> bool:
    body = {"prompt": "x" * 100, "max_tokens": tokens, "ignore_eos": True, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return False
        chunks = 0
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunks += 1
        return chunks > 0


async def concurrent(url: str, n: int, tokens: int) -> tuple[int, float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        ok = await asyncio.gather(*(stream(session, url, tokens) for _ in range(n)))
        return sum(ok), time.perf_counter() - t0


async def constant_rate(url: str, rate: float, seconds: float) -> tuple[int, int, float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        tasks = []
        t0 = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(stream(session, url, 16)))
        sent_in = time.perf_counter() - t0
        ok = await asyncio.gather(*tasks)
        return sum(ok), n, sent_in


def lag_line(s: dict) -> str:
    return (f"lag p50 {s['realtime_lag_p50'] * 1e3:.2f} ms, p99 {s['realtime_lag_p99'] * 1e3:.2f}"
            f" ms, max {s['realtime_lag_max'] * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rates", type=float, nargs="*", default=[50, 100, 200, 400, 800])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--max-lag", type=float, default=0.010)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.streams:
            server = Server(Path(tmp))
            ok, wall = asyncio.run(concurrent(server.url, args.streams, args.tokens))
            s = server.stop()
            print(f"{args.streams} concurrent streams x {args.tokens} tokens: {ok} ok in "
                  f"{wall:.1f} s, mean batch {s['mean_batch_size']:.0f}, {lag_line(s)}")
        best = None
        for rate in args.rates:
            server = Server(Path(tmp))
            ok, n, sent_in = asyncio.run(constant_rate(server.url, rate, args.seconds))
            s = server.stop()
            achieved = n / sent_in if sent_in > 0 else float("inf")
            kept = ok == n and achieved >= 0.95 * rate and s["realtime_lag_p99"] < args.max_lag
            print(f"rate {rate:g} req/s for {args.seconds:g} s: {ok}/{n} ok, sent at "
                  f"{achieved:.0f} req/s, {lag_line(s)}: {'kept up' if kept else 'NOT kept up'}")
            if kept:
                best = rate
        if args.rates:
            print(f"largest rate kept up with (lag p99 < {args.max_lag * 1e3:g} ms): "
                  f"{best if best is not None else 'none'} req/s")


if __name__ == "__main__":
    main()
