"""``orcasim serve`` of a cluster: the router receives the served requests, each replica's
tokens stream to their clients, the served schedule is the offline cluster schedule."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

from orcasim.request import RequestState  # noqa: E402
from orcasim.scenario import Scenario  # noqa: E402
from orcasim.serve.replay import replay  # noqa: E402
from orcasim.serve.run import make_server, serving  # noqa: E402
from tests.test_serve import MEMORY, metrics_of, run  # noqa: E402

CLUSTER = {**MEMORY, "name": "served_cluster",
           "cluster": {"groups": [{"name": "g", "count": 2}], "router": "round_robin"}}


def cluster_config():
    return Scenario(CLUSTER, "test").variants[0]


def test_a_served_cluster_gives_the_offline_cluster_schedule():
    """Round robin over two replicas: requests alternate, and replaying the served arrivals
    through the offline cluster simulation gives the same schedule bit for bit."""
    server = make_server(cluster_config(), seed=0, lengths=(20,), model="sim")
    lengths = [12, 20, 8, 16, 10, 14]
    got: list[int] = []

    async def one(client, n, delay):
        await asyncio.sleep(delay)
        stream = await client.completions.create(
            model="sim", prompt="x" * 40, max_tokens=n, stream=True,
            extra_body={"ignore_eos": True})
        tokens = 0
        async for chunk in stream:
            tokens += chunk.choices[0].text.count("token") if chunk.choices else 0
        got.append(tokens)

    async def main():
        async with serving(server) as s:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x")
            await asyncio.gather(*(one(client, n, 0.03 * i) for i, n in enumerate(lengths)))
            await client.close()

    run(main())
    assert sorted(got) == sorted(lengths)
    served = server.result
    cols = served.columns
    assert cols["replica"] == ["g-0", "g-1"] * 3
    assert (cols["state"] == RequestState.FINISHED).all()
    assert served.summary["num_replicas"] == 2
    assert served.summary["replica.g-0.num_finished"] == 3
    assert served.summary["replica.g-1.num_finished"] == 3
    offline = replay(cluster_config(), cols)
    assert offline.columns["replica"] == cols["replica"]
    for key in ("arrival", "first_scheduled", "first_token", "finish"):
        assert np.array_equal(offline.columns[key], cols[key]), key


def test_a_disconnect_frees_its_replica_and_metrics_sum_over_replicas(tmp_path):
    server = make_server(cluster_config(), seed=0, lengths=(500,), model="sim")

    async def first_chunks(resp, n=3):
        got = 0
        async for line in resp.content:
            got += line.startswith(b"data: ")
            if got == n:
                return

    async def main():
        # the client session outlives the server, so request a is still streaming when
        # the server shuts down
        async with aiohttp.ClientSession() as session:
            async with serving(server) as s:
                url = f"http://127.0.0.1:{s.port}"
                body = {"prompt": "y" * 100, "max_tokens": 500, "ignore_eos": True,
                        "stream": True}
                a = await session.post(url + "/v1/completions", json=body)  # replica g-0
                await first_chunks(a)
                b = await session.post(url + "/v1/completions", json=body)  # replica g-1
                await first_chunks(b)
                both = await metrics_of(session, url)
                b.close()  # its client goes away mid-stream
                for _ in range(100):
                    after = await metrics_of(session, url)
                    if after.get("orcasim:requests_total{reason=client_disconnected,"
                                 "state=aborted}") == 1:
                        break
                    await asyncio.sleep(0.02)
            a.close()
            return both, after

    both, after = run(main())
    run_key = "orcasim:replica_num_requests_running{replica=%s}"
    kv_key = "orcasim:replica_kv_cache_usage_perc{replica=%s}"
    # both replicas run one request each; the cluster's gauges sum them (KV: the mean)
    assert both[run_key % "g-0"] == both[run_key % "g-1"] == 1
    assert both["vllm:num_requests_running"] == 2
    assert both["vllm:num_requests_waiting"] == 0
    assert both[kv_key % "g-0"] > 0 and both[kv_key % "g-1"] > 0
    assert both["vllm:kv_cache_usage_perc"] == (both[kv_key % "g-0"] + both[kv_key % "g-1"]) / 2
    # the disconnect freed g-1's slot and blocks; g-0 still runs its request
    assert after[run_key % "g-1"] == 0 and after[kv_key % "g-1"] == 0
    assert after[run_key % "g-0"] == 1 and after[kv_key % "g-0"] > 0
    assert after["vllm:num_requests_running"] == 1
    assert after["vllm:kv_cache_usage_perc"] == after[kv_key % "g-0"] / 2
    res = server.result
    cols = res.columns
    assert cols["replica"] == ["g-0", "g-1"]
    assert cols["state"].tolist() == [RequestState.ABORTED] * 2
    assert cols["reason"] == ["shutdown", "client_disconnected"]
    assert res.summary["replica.g-1.num_aborted"] == 1
    # the cluster's outputs: the request table with its replica column
    from orcasim.metrics.results import Results

    written = Results(Scenario(CLUSTER, "test"), {res.name: res}, seed=0).write(
        tmp_path, plots=False, requests_csv=True)
    assert any(p.name == "requests.csv" for p in written)
    header = next(p for p in written if p.name == "requests.csv").read_text().splitlines()[0]
    assert "replica" in header.split(",")


@pytest.mark.parametrize("scenario, variant, feature", [
    ("replica_failure", "retry", "faults"),
    ("autoscaling", "ttft-2s", "autoscaling"),
    ("disaggregation", "1p3d", "disaggregation"),
])
def test_cli_refuses_what_cannot_be_served_live(scenario, variant, feature, capsys, tmp_path):
    from orcasim.cli import main

    assert main(["serve", scenario, "--variant", variant, "--port", "0", "--no-plots",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve a cluster with {feature}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
