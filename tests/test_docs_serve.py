"""The code on docs/serve.md runs as written: the shell session and both Python programs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("aiohttp")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

PAGE = ROOT / "docs" / "serve.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def test_the_python_on_the_serve_page_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "docs"}
    for code in blocks("python"):
        exec(compile(code, str(PAGE), "exec"), ns)
    # the autoscaler example: 4 running, 8 queued, so the rule asks for 3 replicas
    assert ns["metrics"]["vllm:num_requests_running"] == 4
    assert ns["waiting"] == 8 and ns["replicas"] == 3
    out = capsys.readouterr().out
    assert "4.0 8.0 3" in out and "TTFT p50: client" in out
    # the load-tool example: 20 requests measured; the client is behind the simulation by
    # the HTTP overhead only
    client_ttft, offline_ttft = ns["ttft_ms"]
    client_itl, offline_itl = ns["itl_ms"]
    assert ns["measured"].shape == (20, 2)
    assert 0 < client_ttft - offline_ttft < 50
    assert abs(client_itl - offline_itl) < 5


def test_the_shell_session_on_the_serve_page_runs(tmp_path):
    (script,) = blocks("bash")
    env = {**os.environ, "MPLBACKEND": "Agg",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer, metric = done.stdout.splitlines()[:2]
    assert json.loads(answer)["usage"]["completion_tokens"] == 16
    assert metric.startswith("vllm:generation_tokens_total{") and metric.endswith(" 16.0")
    assert (tmp_path / "served" / "requests.csv").exists()
    assert "realtime_lag_p99" in (tmp_path / "serve.log").read_text()


def test_the_load_tool_comparison_script_runs_with_the_openai_client(monkeypatch, capsys):
    """benchmarks/serve_vs_offline.py, as on the page but with 12 requests."""
    import runpy

    script = ROOT / "benchmarks" / "serve_vs_offline.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--client", "openai", "--rate", "20",
                                      "--requests", "12", "--output-tokens", "16"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): [float(x) for x in line.split()[2:]]
            for line in out.splitlines() if line.startswith(("ttft ", "itl "))}
    client, offline, diff = rows[("ttft", "median")]
    assert 0 < diff < 50 and diff == pytest.approx(client - offline, abs=0.011)
    assert abs(rows[("itl", "median")][2]) < 5


def test_the_guidellm_comparison_says_when_guidellm_is_missing(monkeypatch, capsys):
    import runpy
    import shutil

    if shutil.which("guidellm"):
        pytest.skip("guidellm is installed")
    script = ROOT / "benchmarks" / "serve_vs_offline.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--client", "guidellm"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 2
    assert "pip install guidellm" in capsys.readouterr().err


def test_the_lag_benchmark_loads_run_against_a_served_engine():
    """benchmarks/bench_serve.py's two loads (concurrent streams, a constant rate), small,
    against an in-process server of the benchmark's scenario."""
    import asyncio
    import importlib.util

    from orcasim.scenario import Scenario
    from orcasim.serve.run import make_server, serving

    spec = importlib.util.spec_from_file_location("bench_serve",
                                                  ROOT / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = Scenario(bench.SCENARIO, "bench").variants[0]
    server = make_server(cfg, seed=0, lengths=[16], model="bench_serve")

    async def main():
        async with serving(server) as s:
            url = f"http://127.0.0.1:{s.port}"
            return await bench.concurrent(url, 20, 5), await bench.constant_rate(url, 100, 0.2)

    (ok, _), (ok_rate, n, _) = asyncio.run(main())
    assert ok == 20 and (ok_rate, n) == (20, 20)
    cols = server.result.columns
    assert sorted(cols["output_len"].tolist()) == [5] * 20 + [16] * 20
    assert server.result.summary["num_finished"] == 40
