"""``orcasim serve``: real clients (the openai package, aiohttp) against the served engine.

Every server binds 127.0.0.1 on a free port and serves a few requests; the
steps are 10-30 ms so a test takes well under a second or two.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from orcasim.request import RequestState  # noqa: E402
from orcasim.scenario import Scenario  # noqa: E402
from orcasim.serve.replay import read_served, replay  # noqa: E402
from orcasim.serve.run import make_server, serving  # noqa: E402

BASE = {
    "name": "served",
    "seed": 0,
    "workload": {"type": "synthetic", "num_requests": 8, "arrival": {"type": "poisson",
                 "rate": 10.0}, "prompt_len": {"type": "fixed", "value": 50},
                 "output_len": {"type": "uniform", "low": 3, "high": 9}},
    "engine": {"latency": {"type": "linear", "base": 0.01, "per_seq": 0.001,
                           "per_token": 0.00001}},
    "policy": {"type": "continuous", "max_batch": 4},
}
MEMORY = {**BASE, "memory": {"num_blocks": 64, "block_size": 16}}


def config(raw: dict | None = None):
    return Scenario(raw or BASE, "test").variants[0]


def server_for(raw: dict | None = None, lengths=(5, 7, 4)):
    return make_server(config(raw), seed=0, lengths=list(lengths), model="sim")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def metrics_of(session, url) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of ``/metrics`` (labels without the model)."""
    text = await (await session.get(url + "/metrics")).text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
                            if labels else "")
            out[key] = s.value
    return out


def test_openai_client_plain_streaming_chat_and_models():
    server = server_for(lengths=(5, 7, 4))

    async def main():
        async with serving(server) as s:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x")
            # the scenario's length (5) under max_tokens: stops on its own
            r = await client.completions.create(model="sim", prompt="hello there", max_tokens=50)
            assert r.choices[0].text == " token" * 5
            assert r.choices[0].finish_reason == "stop"
            assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 5)
            # ignore_eos: exactly max_tokens, although the scenario's next length is 7
            r = await client.completions.create(model="sim", prompt=[1, 2, 3, 4], max_tokens=9,
                                                extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 9 and r.usage.prompt_tokens == 4
            assert r.choices[0].finish_reason == "length"
            # a stream: one chunk per engine step, the usage last
            stream = await client.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": "abcdefgh"}], stream=True,
                max_tokens=3, stream_options={"include_usage": True})
            chunks = [c async for c in stream]
            assert [c.choices[0].delta.content for c in chunks[:-1]] == [" token"] * 3
            assert chunks[0].choices[0].delta.role == "assistant"
            assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, "length"]
            assert chunks[-1].choices == []
            assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (6, 3)
            models = await client.models.list()
            assert [m.id for m in models.data] == ["sim"]
            await client.close()

    run(main())
    res = server.result
    assert res is not None
    cols = res.columns
    assert cols["output_len"].tolist() == [5, 9, 3]
    assert cols["prompt_len"].tolist() == [3, 4, 6]
    assert (cols["state"] == RequestState.FINISHED).all()
    assert res.summary["num_finished"] == 3


def test_served_schedule_is_the_offline_schedule_and_clients_see_it():
    """Replaying the served arrivals offline gives the same schedule bit for bit; the client's
    TTFT and inter-token gaps exceed the simulated ones only by the HTTP overhead."""
    server = server_for(lengths=(20,))
    lengths = [12, 20, 8, 16, 10, 14, 18, 6, 12, 9]
    seen: list[tuple[int, list[float], int]] = []

    async def one(client, n, delay):
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        stream = await client.completions.create(
            model="sim", prompt="x" * 40, max_tokens=n, stream=True,
            extra_body={"ignore_eos": True})
        times, tokens = [], 0
        async for chunk in stream:
            times.append(time.perf_counter() - t0)
            tokens += chunk.choices[0].text.count("token") if chunk.choices else 0
        seen.append((n, times, tokens))

    async def main():
        async with serving(server) as s:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x")
            await asyncio.gather(*(one(client, n, 0.03 * i) for i, n in enumerate(lengths)))
            await client.close()

    run(main())
    served = server.result
    cols = served.columns
    assert sorted(cols["output_len"].tolist()) == sorted(lengths)
    offline = replay(config(), cols).columns
    for key in ("first_scheduled", "first_token", "finish"):
        assert np.array_equal(offline[key], cols[key]), key
    # the client: TTFT and mean inter-token gap against the simulation, request by request
    # (requests are matched by output length, which is unique here... except 12: by order)
    sim = {}
    for n, a, f, e in zip(cols["output_len"], cols["arrival"], cols["first_token"],
                          cols["finish"], strict=True):
        sim.setdefault(int(n), []).append((f - a, (e - f) / (n - 1)))
    ttft_over, itl_over = [], []
    for n, times, tokens in seen:
        # every token arrives; a chunk carries the tokens of each step the server handled at once
        # (one per step unless the server falls behind the simulation)
        assert tokens == n
        assert len(times) <= n
        candidates = sim[n]
        ttft_sim, itl_sim = min(candidates, key=lambda c: abs(c[0] - times[0]))
        ttft_over.append(times[0] - ttft_sim)
        itl_over.append((times[-1] - times[0]) / (n - 1) - itl_sim)
    overhead = float(np.median(ttft_over))
    print(f"TTFT over simulated: median {overhead * 1e3:.2f} ms, "
          f"max {max(ttft_over) * 1e3:.2f} ms; "
          f"mean ITL over simulated: max |{max(abs(x) for x in itl_over) * 1e3:.2f}| ms")
    # a first token cannot reach the client before the simulation emits it
    assert min(ttft_over) > -0.002, ttft_over
    # the HTTP overhead on this machine: a few ms; bounded loosely for a loaded CI machine
    assert overhead < 0.05, ttft_over
    assert max(abs(x) for x in itl_over) < 0.01, itl_over


def test_disconnects_cancel_in_the_simulation_and_free_memory():
    server = server_for(MEMORY, lengths=(500,))

    async def main():
        async with serving(server) as s:
            url = f"http://127.0.0.1:{s.port}"
            async with aiohttp.ClientSession() as session:
                resp = await session.post(url + "/v1/completions", json={
                    "prompt": "y" * 100, "max_tokens": 500, "ignore_eos": True, "stream": True})
                got = 0
                async for line in resp.content:
                    got += line.startswith(b"data: ")
                    if got == 3:
                        break
                resp.close()  # the client goes away mid-stream
                # a plain request whose client gives up after 0.1 s
                with pytest.raises(asyncio.TimeoutError):
                    await session.post(url + "/v1/completions", json={
                        "prompt": "z", "max_tokens": 500, "ignore_eos": True},
                        timeout=aiohttp.ClientTimeout(total=0.1))
                # a scrape reads the gauges while the simulation runs, so the abort counter
                # can lead the slot and block release by a moment: wait for all of them
                for _ in range(200):
                    m = await metrics_of(session, url)
                    if m.get("orcasim:requests_total{reason=client_disconnected,state=aborted}") \
                            == 2 and m["vllm:num_requests_running"] == 0 \
                            and m["vllm:kv_cache_usage_perc"] == 0:
                        break
                    await asyncio.sleep(0.02)
                assert m["orcasim:requests_total{reason=client_disconnected,state=aborted}"] == 2
                assert m["vllm:num_requests_running"] == 0
                assert m["vllm:kv_cache_usage_perc"] == 0
                assert m["vllm:num_requests_waiting"] == 0

    run(main())
    cols = server.result.columns
    assert cols["state"].tolist() == [RequestState.ABORTED] * 2
    assert cols["reason"] == ["client_disconnected"] * 2
    assert 3 <= cols["num_output_tokens"][0] < 500
    assert 1 <= cols["num_output_tokens"][1] < 500  # 0.1 s of 10 ms steps
    assert server.result.summary["num_aborted"] == 2
    # offline, the two clients give up when these went away: the same schedule
    offline = replay(config(MEMORY), cols).columns
    for key in ("state", "num_output_tokens", "first_token", "finish"):
        assert np.array_equal(offline[key], cols[key]), key
    assert offline["reason"] == ["client_timeout"] * 2


def test_errors_are_openai_json_with_their_statuses():
    raw = {**BASE, "policy": {"type": "continuous", "max_batch": 1},
           "admission": [{"type": "max_queue", "limit": 1}]}
    server = server_for(raw)
    bad = [
        (b"{nope", 400, None),
        (b"[1, 2]", 400, None),
        (b"\xff\xfe", 400, None),
        (json.dumps({"prompt": "a", "n": 2}).encode(), 400, "n"),
        (json.dumps({"prompt": "a", "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "a", "max_tokens": "9"}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "a", "stream_options": {"include_usage": True}}).encode(), 400,
         "stream_options"),
        (json.dumps({"prompt": ["a", "b"]}).encode(), 400, "prompt"),
        (json.dumps({"prompt": ""}).encode(), 400, "prompt"),
        (json.dumps({"model": "other", "prompt": "a"}).encode(), 404, "model"),
        (json.dumps({"max_tokens": 3}).encode(), 400, "prompt"),
    ]

    async def main():
        async with serving(server) as s:
            url = f"http://127.0.0.1:{s.port}"
            async with aiohttp.ClientSession() as session:
                for body, status, param in bad:
                    r = await session.post(url + "/v1/completions", data=body)
                    err = (await r.json())["error"]
                    assert (r.status, err["code"], err["param"]) == (status, status, param), body
                    assert err["message"]
                r = await session.post(url + "/v1/chat/completions", json={"messages": []})
                assert r.status == 400
                r = await session.get(url + "/v1/nothing")
                assert r.status == 404 and "error" in await r.json()
                # one runs, one waits, the third is turned away by admission control: 429
                body = {"prompt": "a", "max_tokens": 30, "ignore_eos": True}
                first = asyncio.ensure_future(session.post(url + "/v1/completions", json=body))
                await asyncio.sleep(0.05)
                second = asyncio.ensure_future(session.post(url + "/v1/completions", json=body))
                await asyncio.sleep(0.05)
                r = await session.post(url + "/v1/completions", json=body)
                assert r.status == 429
                assert "queue_full" in (await r.json())["error"]["message"]
                assert (await first).status == 200 and (await second).status == 200
                assert (await session.get(url + "/health")).status == 200
                # stopping: new requests get 503
                s.sim.stop()
                r = await session.post(url + "/v1/completions", json=body)
                assert r.status == 503
                assert (await session.get(url + "/health")).status == 503

    run(main())
    cols = server.result.columns
    assert cols["state"].tolist() == [RequestState.FINISHED, RequestState.FINISHED,
                                      RequestState.REJECTED]
    assert cols["reason"][2] == "queue_full"


def test_metrics_count_what_was_served():
    server = server_for(MEMORY, lengths=(4,))

    async def main():
        async with serving(server) as s:
            url = f"http://127.0.0.1:{s.port}"
            async with aiohttp.ClientSession() as session:
                before = await metrics_of(session, url)
                assert before["vllm:generation_tokens_total"] == 0
                body = {"prompt": "q" * 40, "max_tokens": 6, "ignore_eos": True}
                rs = await asyncio.gather(*(session.post(url + "/v1/completions", json=body)
                                            for _ in range(3)))
                assert [r.status for r in rs] == [200] * 3
                r = await session.post(url + "/v1/completions", json={"prompt": "q" * 8})
                assert r.status == 200
                return await metrics_of(session, url)

    m = run(main())
    assert m["vllm:generation_tokens_total"] == 3 * 6 + 4
    assert m["vllm:prompt_tokens_total"] == 3 * 10 + 2
    assert m["vllm:request_success_total{finished_reason=length}"] == 3
    assert m["vllm:request_success_total{finished_reason=stop}"] == 1
    assert m["vllm:time_to_first_token_seconds_count"] == 4
    assert m["vllm:e2e_request_latency_seconds_count"] == 4
    assert m["vllm:inter_token_latency_seconds_count"] == 3 * 5 + 3
    assert m["vllm:time_per_output_token_seconds_count"] == 3 * 5 + 3
    assert m["vllm:num_requests_running"] == 0
    assert m["vllm:num_preemptions_total"] == 0
    assert m["orcasim:realtime_lag_seconds_count"] > 0
    res = server.result
    # the histograms hold the simulated latencies the results table holds
    ttft = res.columns["first_token"] - res.columns["arrival"]
    assert m["vllm:time_to_first_token_seconds_sum"] == pytest.approx(float(ttft.sum()))
    assert math.isfinite(res.summary["ttft_p50"])


def test_cli_serves_until_sigint_then_writes_the_outputs(tmp_path):
    """The command itself: port 0 printed, requests served, SIGINT aborts the one in flight
    (its stream ends with a 503 error event) and the outputs are written."""
    import os
    import signal
    import subprocess
    import sys

    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(BASE))  # JSON is YAML
    out = tmp_path / "out"
    launched = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orcasim", "serve", str(scenario), "--port", "0",
         "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MPLBACKEND": "Agg"})
    first = []  # wall clock when the first request was sent and when its answer came
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving 'served' (scenario served, variant continuous) on "), line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])

        async def main():
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    first.append(time.time())
                    r = await session.post(url + "/v1/completions", json={"prompt": "abcd"})
                    assert r.status == 200
                    first.append(time.time())
                resp = await session.post(url + "/v1/completions", json={
                    "prompt": "abcd", "max_tokens": 10000, "ignore_eos": True, "stream": True})
                assert resp.status == 200
                await resp.content.readline()
                proc.send_signal(signal.SIGINT)
                events = [json.loads(ln[6:]) if ln != b"data: [DONE]\n" else "DONE"
                          async for ln in resp.content if ln.startswith(b"data: ")]
                assert events[-1] == "DONE"
                assert events[-2]["error"]["code"] == 503
                assert "shutdown" in events[-2]["error"]["message"]

        run(main())
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "realtime_lag_p99" in stdout
    import pandas as pd

    files = {p.name for p in out.iterdir()}
    assert "summary.json" in files and any(f.endswith(".png") for f in files), files
    reqs = pd.read_csv(out / "requests.csv")
    assert reqs["state"].tolist() == ["finished", "finished", "aborted"]
    assert reqs["reason"].fillna("").tolist() == ["", "", "shutdown"]
    # the served run replayed offline from its table: the same schedule
    served = read_served(out / "requests.csv")
    offline = replay(config(), served).columns
    for key in ("state", "first_token", "finish"):
        assert np.array_equal(offline[key], served[key], equal_nan=key != "state"), key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"]["continuous"]["num_aborted"] == 1
    assert summary["variants"]["continuous"]["realtime_lag_p99"] >= 0
    # simulated time 0 on the wall clock: the served requests' simulated times line up with
    # the client's clock (the first request arrived after it was sent, and was answered after
    # it finished)
    start = summary["variants"]["continuous"]["served_start_unix"]
    assert launched < start < first[0]
    assert first[0] < start + reqs["arrival"][0] < start + reqs["finish"][0] < first[1]


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "a port must be in [0, 65535]"),
    (["--variant", "nope"], "no variant 'nope'"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "cannot read"),
    (["--time-scale", "0"], "expected a number > 0"),
])
def test_cli_mistakes_are_one_line_errors(args, message, capsys):
    from orcasim.cli import main

    assert main(["serve", "seed_orca", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_port_in_use_is_a_usage_error(capsys):
    import socket

    from orcasim.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "seed_orca", "--port", str(port), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in err


def test_prompt_tokens_from_a_tokenizer_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    from orcasim.commands.serve import token_counter

    tok = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    count = token_counter(path)
    server = make_server(config(), seed=0, lengths=[2], model="sim", count=count)

    async def main():
        async with serving(server) as s, aiohttp.ClientSession() as session:
            r = await session.post(f"http://127.0.0.1:{s.port}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "a b c d e f g"}]})
            return (await r.json())["usage"]

    assert run(main()) == {"prompt_tokens": 7 + 4, "completion_tokens": 2, "total_tokens": 13}


def test_the_body_guidellm_sends():
    """guidellm's openai_http backend streams with continuous usage stats, ``stop: null``
    and ``ignore_eos``: every chunk carries the usage so far."""
    server = server_for()
    body = {"model": "sim", "prompt": "p" * 20, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": 4, "stop": None, "ignore_eos": True}

    async def main():
        async with serving(server) as s, aiohttp.ClientSession() as session:
            r = await session.post(f"http://127.0.0.1:{s.port}/v1/completions", json=body)
            return [ln[6:] async for ln in r.content if ln.startswith(b"data: ")]

    events = run(main())
    assert events[-1] == b"[DONE]\n"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 4]
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {5}
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == " token" * 4
    assert chunks[-1]["choices"] == []


@pytest.mark.parametrize("policy, memory, preempts", [
    ({"type": "vllm-v1", "num_blocks": 12, "max_num_batched_tokens": 64, "max_num_seqs": 4},
     None, True),
    ({"type": "sarathi", "max_batch": 4}, None, False),
    ({"type": "static", "max_batch": 3}, None, False),
    ({"type": "continuous", "max_batch": 8}, {"num_blocks": 12, "block_size": 16}, True),
])
def test_every_kind_of_policy_streams_the_offline_schedule(policy, memory, preempts):
    """Token policies (chunked prefill, preemption by recompute), batch-at-a-time, and
    decode batches with KV preemption: each stream gets one chunk per emitting step and the
    served schedule is the offline one."""
    raw = {**BASE, "policy": policy, **({"memory": memory} if memory else {})}
    server = server_for(raw)
    sizes = [30, 12, 25, 8, 20, 16]
    chunks: list[tuple[int, list[int]]] = []

    async def one(session, url, n, delay):
        await asyncio.sleep(delay)
        r = await session.post(url + "/v1/completions", json={
            "prompt": "w" * 160, "max_tokens": n, "ignore_eos": True, "stream": True})
        assert r.status == 200
        got = [json.loads(ln[6:]) async for ln in r.content if ln.startswith(b"data: {")]
        chunks.append((n, [len(c["choices"][0]["text"]) // len(" token") for c in got]))

    async def main():
        async with serving(server) as s, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{s.port}"
            await asyncio.gather(*(one(session, url, n, 0.01 * i) for i, n in enumerate(sizes)))

    run(main())
    for n, per_chunk in chunks:
        assert sum(per_chunk) == n and all(k >= 1 for k in per_chunk)
    cols = server.result.columns
    offline = replay(config(raw), cols)
    for key in ("first_scheduled", "first_token", "finish", "num_preemptions"):
        assert np.array_equal(offline.columns[key], cols[key]), key
    assert offline.summary["num_preemptions"] == server.result.summary["num_preemptions"]
    assert (server.result.summary["num_preemptions"] > 0) == preempts


def test_a_failing_simulation_answers_500_and_never_leaves_a_client_waiting():
    from orcasim.errors import SimulationError

    server = server_for()
    build = server._factory

    def broken(notify):
        sim = build(notify)
        sim.model.latency.step_time = lambda plan: -1.0  # a latency model gone wrong
        return sim

    server._factory = broken

    async def main():
        async with serving(server) as s, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{s.port}"
            r = await session.post(url + "/v1/completions", json={"prompt": "a", "stream": True})
            assert r.status == 500
            assert (await r.json())["error"]["code"] == 500
            r = await session.post(url + "/v1/completions", json={"prompt": "a"})
            assert r.status == 503
            assert (await session.get(url + "/health")).status == 503

    with pytest.raises(SimulationError, match=r"returned a step time of -1\.0"):
        run(main())


@pytest.mark.parametrize("chat", [False, True])
def test_the_chunk_template_writes_the_chunk_json_writes(chat):
    from orcasim.serve import api

    c = api.parse_request(json.dumps({"model": 'a " token\\x00', "messages": [
        {"role": "user", "content": "x"}], "prompt": "x", "stream": True}).encode(),
        chat=chat, models=['a " token\\x00'])
    prefix, suffix = api.chunk_template(c, "id-1", 7)
    for k in (1, 3):
        assert prefix + api.TOKEN_TEXT.encode() * k + suffix == \
            api.sse(api.chunk(c, "id-1", 7, k))


def test_time_scale_runs_the_simulated_clock_faster_than_the_wall_clock():
    cfg = config()
    server = make_server(cfg, seed=0, lengths=[40], model="sim", factor=0.25)

    async def main():
        async with serving(server) as s, aiohttp.ClientSession() as session:
            t0 = time.perf_counter()
            r = await session.post(f"http://127.0.0.1:{s.port}/v1/completions",
                                   json={"prompt": "a", "max_tokens": 40, "ignore_eos": True})
            assert r.status == 200
            return time.perf_counter() - t0

    wall = run(main())
    cols = server.result.columns
    simulated = float(cols["finish"][0] - cols["arrival"][0])
    # 40 steps of one sequence reading 1, 2, ... 40 KV tokens: 40 x 11 ms + 820 x 10 us
    assert simulated == pytest.approx(40 * 0.011 + 820 * 0.00001, rel=1e-9)
    assert simulated / 4 <= wall < simulated * 0.75
