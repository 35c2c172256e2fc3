"""The client's view: the API server in front of the engine, and inference-perf's lifecycle
figures computed from it, checked against values worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

import orcasim
from orcasim.api_server import TOO_LONG
from orcasim.cli import main
from orcasim.metrics.lifecycle import summarize
from orcasim.simulation import generate_workload, simulate

# one system prompt, one user: every request sends the same 1 + 10 + 5 = 16-token prompt and
# asks for 3 tokens; one stage of 2 requests, the second sent at exactly 1.0 s
TINY = {
    "load": {"type": "constant", "stages": [{"rate": 2, "duration": 1}]},
    "api": {"type": "completion", "streaming": True},
    "server": {"type": "vllm", "base_url": "http://localhost:8000", "ignore_eos": True},
    "data": {"type": "shared_prefix", "shared_prefix": {
        "num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": 10,
        "question_len": 5, "output_len": 3}},
    "report": {"request_lifecycle": {"percentiles": [50, 90]}},
}
# 1 ms per request + 0.1 ms per prompt token in the server, 2 ms per streamed message
FRONT = {"request_s": 0.001, "per_prompt_token_s": 0.0001, "per_output_s": 0.002}


def scenario(config: dict, frontend=None, max_model_len: int = 4096, **workload
             ) -> orcasim.Scenario:
    engine: dict = {"latency": {"type": "constant", "step_time": 0.01}}
    if frontend is not None:
        engine["frontend"] = frontend
    return orcasim.Scenario({
        "workload": {"type": "inference_perf", "config": config, **workload},
        "engine": engine,
        "policy": {"type": "vllm-v1", "max_num_seqs": 8, "max_num_batched_tokens": 512,
                   "max_model_len": max_model_len, "num_blocks": 400, "block_size": 16}})


def run_files(tmp_path, sc_raw: dict) -> tuple[dict, dict]:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sc_raw))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    d = tmp_path / "out" / "inference_perf" / "vllm-v1"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    return (json.loads((d / "summary_lifecycle_metrics.json").read_text()),
            summary["variants"]["vllm-v1"])


@pytest.mark.parametrize("version,api,tpot,itl_mean,itl_median,tokens", [
    # n = 3 tokens, client times c1 = q + 0.012 and c3 = q + 0.032 (span 0.02 s)
    ("0.6", "completion", 0.02 / 2, 0.01, 0.01, 3),     # 2 gaps of 10 ms
    ("0.5", "completion", 0.02 / 5, 0.02 / 5, 0.0, 6),  # 6 stamps: 2 gaps of 10 ms, 3 of 0
    ("0.4", "completion", 0.02 / 3, 0.02 / 3, 0.01, 4),  # 3 messages + [DONE]: one more 0
    ("0.4", "chat", 0.02 / 4, 0.02 / 4, 0.005, 4),      # and the role-only message: two 0s
])
def test_lifecycle_figures_are_the_clients_as_inference_perf_computes_them(
        tmp_path, version, api, tpot, itl_mean, itl_median, tokens):
    sc = scenario({**TINY, "api": {"type": api, "streaming": True}}, FRONT,
                  inference_perf_version=version)
    offset = generate_workload(sc.variants[0], 0).release.offset
    assert offset[1] == 1.0 and offset[0] < 0.9  # the two requests never overlap
    life, summ = run_files(tmp_path, {**sc.raw, "seed": 0})
    # sent at s, through the server at q = s + 0.001 + 16 x 0.0001, first token q + 0.01,
    # last q + 0.03; the client sees each 2 ms later
    ttft, e2e = 0.0026 + 0.012, 0.0026 + 0.032
    lat = life["successes"]["latency"]
    assert lat["time_to_first_token"]["mean"] == pytest.approx(ttft, abs=1e-12)
    assert lat["request_latency"]["median"] == pytest.approx(e2e, abs=1e-12)
    assert lat["request_latency"]["p90"] == pytest.approx(e2e, abs=1e-12)
    assert lat["time_per_output_token"]["mean"] == pytest.approx(tpot, abs=1e-12)
    assert lat["inter_token_latency"]["mean"] == pytest.approx(itl_mean, abs=1e-12)
    assert lat["inter_token_latency"]["median"] == pytest.approx(itl_median, abs=1e-12)
    assert lat["normalized_time_per_output_token"]["mean"] == pytest.approx(e2e / tokens,
                                                                             abs=1e-12)
    assert life["successes"]["output_len"]["mean"] == tokens
    assert life["successes"]["prompt_len"]["mean"] == 16
    assert life["load_summary"]["schedule_delay"]["max"] == pytest.approx(0.0, abs=1e-12)
    span = 1.0 + e2e - offset[0]  # first send to last message received
    assert life["successes"]["throughput"]["output_tokens_per_sec"] == pytest.approx(
        2 * tokens / span, rel=1e-9)
    # summary.json keeps the engine's view and adds the client's
    assert summ["ttft_mean"] == pytest.approx(0.01, abs=1e-12)
    assert summ["e2e_mean"] == pytest.approx(0.03, abs=1e-12)
    assert summ["client_ttft_mean"] == pytest.approx(ttft, abs=1e-12)
    assert summ["client_e2e_mean"] == pytest.approx(e2e, abs=1e-12)
    assert summ["client_tpot_mean"] == pytest.approx(0.01, abs=1e-12)
    assert summ["class.stage0.client_ttft_p50"] == pytest.approx(ttft, abs=1e-12)
    assert summ["class.stage0.client_e2e_p99"] == pytest.approx(e2e, abs=1e-12)
    req = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert (req["arrival"] - req["sent"]).tolist() == pytest.approx([0.0026] * 2, abs=1e-12)
    assert req["sent"].tolist() == pytest.approx([offset[0], 1.0], abs=1e-12)


def test_the_front_end_is_on_by_default_for_inference_perf_and_can_be_turned_off():
    on = scenario(TINY).variants[0]
    assert on.frontend is not None and on.frontend.per_output_s == pytest.approx(3.357e-3)
    assert on.to_dict()["engine"]["frontend"]["request_s"] == pytest.approx(232e-6)
    for off in (False, "off"):
        v = scenario(TINY, off).variants[0]
        assert v.frontend is None and v.to_dict()["engine"]["frontend"] is False
        # the resolved configuration reads back the same
        assert orcasim.Scenario(v.to_dict()).variants[0].frontend is None
    for on_word in (True, "on", "true", {}):
        assert scenario(TINY, on_word).variants[0].frontend == on.frontend
    listed_on = orcasim.Scenario({"workload": {"type": "list", "requests": [
        {"arrival": 0, "prompt_len": 8, "output_len": 2}]}, "policy": "vllm-v1",
        "engine": {"frontend": "on"}}).variants[0]
    assert listed_on.frontend == on.frontend
    res = simulate(scenario(TINY, False), 0)["vllm-v1"]
    assert "sent" not in res.columns and "client_ttft_mean" not in res.summary
    with_defaults = simulate(scenario(TINY), 0)["vllm-v1"]
    cols = with_defaults.columns
    # engine arrival = send + 232 us + 16 x 1.75 us
    assert cols["arrival"] - cols["sent"] == pytest.approx([232e-6 + 16 * 1.75e-6] * 2)
    # other workloads: off unless asked for
    listed = orcasim.Scenario({"workload": {"type": "list", "requests": [
        {"arrival": 0, "prompt_len": 8, "output_len": 2}]}, "policy": "vllm-v1"}).variants[0]
    assert listed.frontend is None


def test_a_bad_frontend_value_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**scenario(TINY).raw, "engine": {
        "latency": {"type": "constant", "step_time": 0.01}, "frontend": "sometimes"}}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "engine.frontend" in err and len(err.splitlines()) == 1


def test_multi_turn_rounds_and_stages_start_when_the_client_has_the_last_message():
    cfg = {**TINY, "load": {"type": "constant", "interval": 1, "stages": [
        {"rate": 3, "duration": 1}, {"rate": 1, "duration": 1}]},
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": 10,
            "question_len": 5, "output_len": 3, "enable_multi_turn_chat": True}}}
    sc = scenario(cfg, FRONT)
    arr = generate_workload(sc.variants[0], 2)
    cols = simulate(sc, 2)["vllm-v1"].columns
    sent, finish = cols["sent"], cols["finish"]
    sched = arr.release.offset
    for j in (1, 2):  # one user: round j waits for round j - 1's last message
        assert sent[j] == pytest.approx(max(sched[j], finish[j - 1] + 0.002), abs=1e-12)
    # the next stage: queued at -1, the end seen at the next whole second, pause 1, lead 1
    seen = -1 + np.ceil(finish[2] + 0.002 + 1)
    assert sent[3] == pytest.approx(seen + 1 + 1 + sched[3], abs=1e-9)


def test_prompt_plus_max_tokens_over_max_model_len_is_a_400_before_the_engine(tmp_path):
    # 16 + 3 = 19 tokens > 18: refused by the API server, front end on or off
    for frontend in (FRONT, False):
        sc = scenario(TINY, frontend, max_model_len=18)
        v = simulate(sc, 0)["vllm-v1"]
        assert (v.columns["state"] == 4).all()
        assert v.columns["reason"] == [TOO_LONG] * 2
        assert v.summary[f"rejected_{TOO_LONG}"] == 2 and v.summary["num_finished"] == 0
        if frontend:  # turned away once the server has read the prompt
            assert v.columns["arrival"] - v.columns["sent"] == pytest.approx([0.0026] * 2)
    life, _ = run_files(tmp_path, {**scenario(TINY, FRONT, max_model_len=18).raw, "seed": 0})
    assert life["successes"]["count"] == 0 and life["failures"]["count"] == 2
    assert life["failures"]["request_latency"]["mean"] == pytest.approx(0.0026, abs=1e-12)
    # 19 tokens fit in 19: it runs
    ok = simulate(scenario(TINY, FRONT, max_model_len=19), 0)["vllm-v1"]
    assert ok.summary["num_finished"] == 2
    # a workload without max_tokens keeps vLLM's engine behaviour (stops at max_model_len)
    listed = orcasim.Scenario({
        "workload": {"type": "list", "requests": [{"arrival": 0, "prompt_len": 16,
                                                   "output_len": 3}]},
        "engine": {"latency": {"type": "constant", "step_time": 0.01}, "frontend": FRONT},
        "policy": {"type": "vllm-v1", "max_model_len": 18}})
    res = simulate(listed, 0)["vllm-v1"]
    assert res.columns["state"].tolist() == [3] and res.columns["reason"] == ["max_model_len"]


def test_a_client_timeout_counts_from_the_send_not_from_the_engine_queue():
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [
            {"arrival": 0, "prompt_len": 8, "output_len": 10, "timeout": 0.6}]},
        "engine": {"latency": {"type": "constant", "step_time": 0.05},
                   "frontend": {"request_s": 0.5, "per_prompt_token_s": 0, "per_output_s": 0}},
        "policy": {"type": "vllm-v1"}})
    cols = simulate(sc, 0)["vllm-v1"].columns
    # queued at 0.5; it would finish at 1.0, but its client gives up 0.6 s after sending
    assert cols["state"].tolist() == [5] and cols["reason"] == ["client_timeout"]
    assert cols["finish"].tolist() == pytest.approx([0.6])


def test_weighted_summary_equals_the_repeated_sample():
    rng = np.random.default_rng(5)
    x = rng.random(40)
    w = rng.integers(0, 5, 40)
    qs = [0.1, 1, 25, 50, 90, 99.9]
    got = summarize(x, qs, weights=w)
    want = summarize(np.repeat(x, w), qs)
    assert got == pytest.approx(want, rel=1e-12)
    assert summarize(x, qs, weights=np.zeros(40, int)) is None


def test_a_failed_multi_turn_round_stays_out_of_the_history():
    # one user, 4 rounds: round r asks 1 + 15 (r + 1) + 3 r = 16 + 18 r tokens and 3 more;
    # with max_model_len 40, round 2 (52 + 3) is refused, and round 3 resends its prompt
    cfg = {**TINY, "load": {"type": "constant", "stages": [{"rate": 4, "duration": 1}]},
           "data": {"type": "shared_prefix", "shared_prefix": {
               "num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": 10,
               "question_len": 5, "output_len": 3, "enable_multi_turn_chat": True}}}
    sc = scenario(cfg, FRONT, max_model_len=40)
    arr = generate_workload(sc.variants[0], 0)
    assert arr.prompt_len.tolist() == [16, 34, 52, 70]  # the history if every round succeeds
    v = simulate(sc, 0)["vllm-v1"]
    cols = v.columns
    assert cols["state"].tolist() == [3, 3, 4, 4]
    assert cols["prompt_len"].tolist() == [16, 34, 52, 52]
    assert v.summary[f"rejected_{TOO_LONG}"] == 2
    # with room for round 2 every round runs on the whole history
    ok = simulate(scenario(cfg, FRONT, max_model_len=80), 0)["vllm-v1"].columns
    assert ok["prompt_len"].tolist() == [16, 34, 52, 70] and (ok["state"] == 3).all()


def test_after_a_failed_round_the_conversation_continues_from_the_last_success():
    import simpy

    from orcasim.context import SchedulerContext
    from orcasim.metrics.recorder import Recorder
    from orcasim.staged_source import StagedRelease
    from orcasim.workload.base import WorkloadArrays

    # one conversation of 4 rounds whose prompts grow 10, 20, 30, 40; round 1 fails
    env = simpy.Environment()
    ctx = SchedulerContext(env, Recorder(), seed=0)
    rel = StagedRelease(stage=np.zeros(4, dtype=np.int64), offset=np.zeros(4),
                        prev=np.array([-1, 0, 1, 2]), counts=(4,), resend_failed=True)
    arrays = WorkloadArrays(arrival=np.zeros(4), prompt_len=np.array([10, 20, 30, 40]),
                            output_len=np.ones(4, dtype=np.int64), release=rel)
    arrays.attrs["hash_ids"] = [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    rel.source(env, ctx, arrays)
    sent = []
    ctx.submit = lambda req: sent.append(req)  # the rounds as the client sends them
    env.run()
    for state in (3, 5, 3):  # round 0 finishes, round 1 is aborted, round 2 finishes
        req = sent[-1]
        req.state = state
        ctx.on_end(req)  # what the context calls when a request ends
    assert [r.prompt_len for r in sent] == [10, 20, 20, 30]
    assert [r.hash_ids for r in sent] == [(1,), (1, 2), (1, 2), (1, 2, 3)]
