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
    # the cluster example: round robin over two replicas, the offline replay's schedule
    assert ns["cluster_cols"]["replica"] == ["r-0", "r-1", "r-0", "r-1"]
    assert (ns["offline_cols"]["finish"] == ns["cluster_cols"]["finish"]).all()
    assert "['r-0', 'r-1', 'r-0', 'r-1']\nTrue" in out
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
    assert "served schedule equals the offline replay" in out
    # the per-request TTFT difference splits into the way there and the way back, both
    # positive, their means adding up to the mean difference
    means = {line.split(":")[0].strip(): float(line.rsplit("mean ", 1)[1].split()[0])
             for line in out.splitlines() if line.startswith("per request")}
    there = means["per request,   request"]
    back = means["per request,   response"]
    assert there > 0 and back > 0
    assert there + back == pytest.approx(means["per request, TTFT, openai - offline"], abs=0.02)
    assert means["per request, TTFT, openai - offline"] == pytest.approx(
        rows[("ttft", "mean")][2], abs=0.011)


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


def comparison_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "serve_vs_offline", ROOT / "benchmarks" / "serve_vs_offline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_comparison_reads_a_guidellm_report_and_pairs_requests():
    """A guidellm 0.8.1 JSON report (the fields the script reads, values from a real run):
    each request is paired with its served request by the response id."""
    pd = pytest.importorskip("pandas")
    mod = comparison_script()

    def request(rid, ttft, itl, sent, first):
        return {"response_id": rid, "time_to_first_token_ms": ttft,
                "inter_token_latency_ms": itl,
                "info": {"timings": {"request_start": sent, "first_token_iteration": first}}}

    def metric(mean, median, p99):
        return {"successful": {"mean": mean, "median": median,
                               "percentiles": {"p50": median, "p99": p99}}}

    report = {"benchmarks": [{
        "metrics": {"time_to_first_token_ms": metric(24.67, 24.57, 34.76),
                    "inter_token_latency_ms": metric(15.4, 15.6, 16.1)},
        "requests": {"successful": [
            request("cmpl-1", 17.0, 14.5, 1000.100, 1000.117),
            request("cmpl-0", 16.0, 14.0, 1000.000, 1000.016)],
            "errored": [], "incomplete": []}}]}
    measured = mod.guidellm_measured(report)
    assert measured == {0: (16.0, 14.0, 1000.000, 1000.016),
                        1: (17.0, 14.5, 1000.100, 1000.117)}
    assert mod.guidellm_reported(report) == {
        "ttft": {"mean": 24.67, "median": 24.57, "p99": 34.76},
        "itl": {"mean": 15.4, "median": 15.6, "p99": 16.1}}
    # the served run started at Unix time 1000; request 0 arrived 2 ms after it was sent
    # and had its first token 10 ms later; request 1: 1 ms there, 12 ms to the first token
    offline = pd.DataFrame({"id": [0, 1, 2], "arrival": [0.002, 0.101, 0.2],
                            "first_token": [0.012, 0.113, 0.21],
                            "ttft": [0.010, 0.012, 0.01], "tpot": [0.0141, 0.0144, 0.01]})
    res = mod.compare(measured, offline, start_unix=1000.0)
    assert res["n"] == 2
    assert res["offline"]["ttft"]["median"] == pytest.approx(11.0)
    assert res["overhead"]["ttft"]["mean"] == pytest.approx(5.5)   # (16-10 + 17-12) / 2
    assert res["overhead"]["itl"]["median"] == pytest.approx(0.0)  # -0.1 and +0.1
    assert res["overhead"]["request"]["mean"] == pytest.approx(1.5, abs=1e-6)
    assert res["overhead"]["response"]["mean"] == pytest.approx(4.0, abs=1e-6)
    assert mod.served_id("chatcmpl-12") == 12


def test_the_comparison_tokenizer_cuts_prompts_to_exact_lengths(tmp_path):
    """guidellm cuts a synthetic prompt (ASCII prose: words, single spaces and newlines) to n
    tokens by decoding its first n token ids; the script's tokenizer gives the server
    exactly n tokens for that text, for every n."""
    from tokenizers import Tokenizer

    from orcasim.commands.serve import token_counter

    mod = comparison_script()
    path = mod.build_tokenizer(tmp_path / "tok")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    count = token_counter(path / "tokenizer.json")
    paragraphs = (ROOT / "README.md").read_text().split("\n\n")
    text = "\n".join(" ".join(p.split()) for p in paragraphs).encode("ascii", "ignore").decode()
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > 1000
    assert [n for n in range(1, len(ids) + 1) if count(tok.decode(ids[:n])) != n] == []
    assert json.loads((path / "tokenizer_config.json").read_text()) == {
        "tokenizer_class": "PreTrainedTokenizerFast"}


def test_the_comparison_tokenizer_loads_as_guidellm_loads_it(tmp_path):
    transformers = pytest.importorskip("transformers")  # guidellm's dependency, not orcasim's
    mod = comparison_script()
    path = mod.build_tokenizer(tmp_path / "tok")
    processor = transformers.AutoTokenizer.from_pretrained(str(path))
    ids = processor.encode("the simulated engine emits 128 tokens")
    assert processor.decode(ids) == "the simulated engine emits 128 tokens"


def test_the_guidellm_command_on_the_page_is_the_one_the_script_runs():
    """The page shows the ``guidellm run`` command (it needs guidellm, so it is not run
    here); it is what the script runs for the page's options."""
    import argparse
    import shlex

    mod = comparison_script()
    text = PAGE.read_text()
    start = text.index("    guidellm run ")
    shown = text[start:text.index("\n\n", start)].replace("\\\n", " ")
    args = argparse.Namespace(rate=20.0, requests=300, prompt_tokens=128, output_tokens=64)
    cmd = mod.guidellm_command("$URL", args, Path("$TOKENIZER_DIR"), Path("benchmarks.json"))
    assert shlex.split(shown) == ["guidellm", *cmd[1:]]
    assert "python benchmarks/serve_vs_offline.py --client guidellm --rate 20 --requests 300" \
        in text


def test_the_guidellm_comparison_runs_with_guidellm(monkeypatch, capsys):
    """benchmarks/serve_vs_offline.py with guidellm itself, 10 requests; only where
    guidellm is installed (it is not a test dependency)."""
    import runpy
    import shutil

    if shutil.which("guidellm") is None:
        pytest.skip("guidellm is not installed")
    script = ROOT / "benchmarks" / "serve_vs_offline.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--client", "guidellm", "--rate", "10",
                                      "--requests", "10", "--output-tokens", "16"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "guidellm: 10 of 10 requests" in out and "served prompt lengths [128]" in out
    assert "served schedule equals the offline replay" in out
    rows = {tuple(line.split()[:2]): [float(x) for x in line.split()[2:]]
            for line in out.splitlines() if line.startswith(("ttft ", "itl "))}
    assert 0 < rows[("ttft", "median")][2] < 50
    assert abs(rows[("itl", "median")][2]) < 5
    assert "guidellm's own report: ttft median" in out


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
