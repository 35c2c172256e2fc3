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
