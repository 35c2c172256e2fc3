"""The inference_perf workload: inference-perf configs as request streams; lifecycle files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

import orcasim
from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.simulation import generate_workload, simulate
from orcasim.workload.inference_perf import stage_offsets

SHARED = {
    "load": {"type": "constant", "interval": 2, "stages": [{"rate": 2, "duration": 5},
                                                            {"rate": 1, "duration": 4}]},
    "api": {"type": "completion", "streaming": True},
    "server": {"type": "vllm", "base_url": "http://localhost:8000", "ignore_eos": True},
    "data": {"type": "shared_prefix", "shared_prefix": {
        "num_unique_system_prompts": 2, "num_users_per_system_prompt": 3,
        "system_prompt_len": 100, "question_len": 20, "output_len": 10}},
}


def scenario(config, *, latency=None, **workload) -> orcasim.Scenario:
    return orcasim.Scenario({
        "workload": {"type": "inference_perf", "config": config, **workload},
        "engine": {"latency": latency or {"type": "constant", "step_time": 0.01}},
        "policy": {"type": "vllm-v1", "max_num_seqs": 8, "max_num_batched_tokens": 512,
                   "max_model_len": 4096, "num_blocks": 4000, "block_size": 16},
    })


def with_(base: dict, **sections) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in sections.items():
        sec, _, field = key.partition("__")
        if field:
            out[sec][field] = value
        else:
            out[sec] = value
    return out


def test_shared_prefix_stream_counts_lengths_and_prefix_blocks():
    arr = generate_workload(scenario(SHARED).variants[0], 7)
    cls = list(arr.attrs["cls"])
    assert cls == ["stage0"] * 10 + ["stage1"] * 4  # int(rate x duration) per stage
    assert arr.prompt_len.tolist() == [1 + 100 + 20] * 14  # BOS + system prompt + question
    assert arr.output_len.tolist() == [10] * 14
    ids = arr.attrs["hash_ids"]
    assert all(len(h) == math.ceil(121 / 16) == 8 for h in ids)
    # 6 prompts (2 groups x 3 users): request j sends prompt j mod 6, in every stage
    assert ids[6] == ids[0] and ids[7] == ids[1] and ids[10] == ids[0] and ids[13] == ids[3]
    prompts = {tuple(h) for h in ids}
    assert len(prompts) == 6
    # blocks wholly inside BOS + system prompt (101 tokens: 6 of 16) are the group's
    heads = {tuple(h[:6]) for h in prompts}
    assert len(heads) == 2 and all(sum(h[:6] == x[:6] for x in map(list, prompts)) == 3
                                   for h in map(list, prompts))
    assert len({h[6] for h in prompts}) == 6  # block 6 holds the question: each prompt's own
    assert arr.attrs["hash_block_size"] == [16] * 14
    rel = arr.release
    assert rel.stage.tolist() == [0] * 10 + [1] * 4
    # constant stages: exponential gaps rescaled to end exactly at the duration
    assert rel.offset[9] == pytest.approx(5.0, abs=1e-12) and rel.offset[13] == pytest.approx(4.0)
    assert np.all(np.diff(rel.offset[:10]) > 0) and rel.interval == 2


def test_stage_offsets_constant_and_poisson():
    rng = np.random.default_rng(3)
    c = stage_offsets("constant", 3.0, 10, rng)
    assert len(c) == 30 and c[-1] == pytest.approx(10.0, abs=1e-12)
    p = stage_offsets("poisson", 3.0, 10, np.random.default_rng(3))
    assert len(p) == 30 and np.all(np.diff(p) >= 0)
    # each second's requests end exactly on the second's boundary
    whole = p[np.isclose(p, np.round(p), atol=1e-9)]
    assert len(whole) >= 5
    assert len(stage_offsets("constant", 0.5, 1, rng)) == 0


def test_stages_wait_for_each_other_and_sends_are_recorded():
    res = simulate(scenario(SHARED), 7)
    v = res["vllm-v1"]
    cols = v.columns
    arrival, finish = cols["arrival"], cols["finish"]
    assert (cols["state"] == 3).all()  # all finished
    rel = generate_workload(v.config, 7).release
    assert np.allclose(arrival[:10], rel.offset[:10])
    last = finish[:10].max()
    origin1 = -1 + math.ceil(last + 1) + 2 + 1  # queued at -1, polled each second, interval 2
    assert np.allclose(arrival[10:], origin1 + rel.offset[10:])
    assert v.summary["class.stage0.num_finished"] == 10
    assert v.summary["class.stage1.num_finished"] == 4


def test_a_stage_without_requests_only_adds_its_pause():
    cfg = with_(SHARED, load={"type": "constant", "interval": 1, "stages": [
        {"rate": 2, "duration": 2}, {"rate": 0.5, "duration": 1}, {"rate": 1, "duration": 2}]})
    sc = scenario(cfg)
    arr = generate_workload(sc.variants[0], 4)
    assert arr.release.counts == (4, 0, 2) and list(arr.attrs["cls"]) == ["stage0"] * 4 + [
        "stage2"] * 2
    cols = simulate(sc, 4)["vllm-v1"].columns
    origin1 = -1 + math.ceil(cols["finish"][:4].max() + 1) + 1 + 1
    origin2 = origin1 - 1 + 1 + 1  # queued, ended at once, pause, lead
    assert np.allclose(cols["arrival"][4:], origin2 + arr.release.offset[4:])


def test_multi_turn_users_round_robin_with_growing_history():
    cfg = with_(SHARED, load={"type": "constant", "stages": [{"rate": 3, "duration": 4}]},
                data={"type": "shared_prefix", "shared_prefix": {
                    "num_groups": 1, "num_prompts_per_group": 4, "system_prompt_len": 50,
                    "question_len": 14, "output_len": 30, "enable_multi_turn_chat": True}})
    sc = scenario(cfg)
    arr = generate_workload(sc.variants[0], 1)
    # 12 requests, 4 users round robin: request j is user j mod 4, round j div 4
    rounds = np.arange(12) // 4
    assert arr.prompt_len.tolist() == (1 + (rounds + 1) * 64 + rounds * 30).tolist()
    assert arr.release.prev.tolist() == [-1] * 4 + list(range(8))
    names = arr.attrs["name"]
    users = [n.split(".")[1] for n in names]
    assert users[:4] == users[4:8] == users[8:] and len(set(users[:4])) == 4
    assert arr.attrs["session"][0] == f"st0.{users[0]}"
    # a later round's prompt starts with the earlier round's prompt blocks
    ids = arr.attrs["hash_ids"]
    assert ids[4][:len(ids[0]) - 1] == ids[0][:-1] and ids[8][:9] == ids[4][:9]
    res = simulate(sc, 1)
    cols = res["vllm-v1"].columns
    sched = arr.release.offset
    for j in range(4, 12):  # sent at its schedule, or when the previous round ended
        assert cols["arrival"][j] == pytest.approx(max(sched[j], cols["finish"][j - 4]),
                                                   abs=1e-9)
    assert res["vllm-v1"].summary["prefix_cache_hit_rate"] > 0.3


def test_multi_turn_sessions_of_inference_perf_before_0_5_start_with_the_system_prompt():
    cfg = with_(SHARED, load={"type": "constant", "stages": [{"rate": 2, "duration": 2}]},
                data={"type": "shared_prefix", "shared_prefix": {
                    "num_groups": 1, "num_prompts_per_group": 2, "system_prompt_len": 40,
                    "question_len": 8, "output_len": 5, "enable_multi_turn_chat": True}})
    arr = generate_workload(scenario(cfg, session_start="system_prompt").variants[0], 1)
    rounds = np.arange(4) // 2
    assert arr.prompt_len.tolist() == (1 + 40 + (rounds + 1) * 48 + rounds * 5).tolist()
    # BOS and the system prompt twice (89 tokens): 5 whole blocks shared by both users
    ids = arr.attrs["hash_ids"]
    assert ids[0][:5] == ids[1][:5] and ids[0][5] != ids[1][5]


def test_random_lengths_client_timeout_and_concurrency():
    cfg = with_(SHARED, data={"type": "random",
                              "input_distribution": {"min": 5, "max": 5, "mean": 5,
                                                     "type": "fixed"},
                              "output_distribution": {"min": 20, "max": 40, "mean": 30,
                                                      "std_dev": 5}},
                load={"type": "poisson", "stages": [{"rate": 4, "duration": 3}],
                      "request_timeout": 0.15, "num_workers": 1,
                      "worker_max_concurrency": 2})
    sc = scenario(cfg)
    arr = generate_workload(sc.variants[0], 2)
    assert len(arr) == 12 and arr.prompt_len.tolist() == [6] * 12
    assert arr.output_len.min() >= 20 and arr.output_len.max() <= 40
    assert "hash_ids" not in arr.attrs and arr.attrs["timeout"] == [0.15] * 12
    assert arr.release.max_concurrency == 2
    cols = simulate(sc, 2)["vllm-v1"].columns
    # 0.01 s steps: 20+ tokens take > 0.2 s, past the client's 0.15 s limit
    assert (cols["state"] == 5).all() and set(cols["reason"]) == {"client_timeout"}
    assert np.allclose(cols["finish"] - cols["arrival"], 0.15)
    # never more than 2 in flight: each send waits for a slot
    events = sorted([(t, 1) for t in cols["arrival"]] + [(t, -1) for t in cols["finish"]],
                    key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) <= 2


def test_lifecycle_files_match_the_requests(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(with_(SHARED, report={"request_lifecycle": {
        "percentiles": [50, 90]}})))
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump({
        "workload": {"type": "inference_perf", "config": str(path)},
        "engine": {"latency": {"type": "constant", "step_time": 0.01}},
        "policy": {"type": "vllm-v1", "max_num_seqs": 8, "max_num_batched_tokens": 512,
                   "max_model_len": 4096, "num_blocks": 4000}}))
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--no-plots"]) == 0
    import pandas as pd

    req = pd.read_parquet(out / "requests.parquet")
    d = out / "inference_perf" / "vllm-v1"
    stage1 = json.loads((d / "stage_1_lifecycle_metrics.json").read_text())
    summary = json.loads((d / "summary_lifecycle_metrics.json").read_text())
    r1 = req[req["cls"] == "stage1"]
    lat = stage1["successes"]["latency"]
    assert set(lat) == {"request_latency", "normalized_time_per_output_token",
                        "time_per_output_token", "time_to_first_token", "inter_token_latency"}
    e2e = (r1["finish"] - r1["arrival"]).to_numpy()
    assert lat["request_latency"]["mean"] == pytest.approx(e2e.mean(), rel=1e-12)
    assert lat["request_latency"]["median"] == pytest.approx(np.median(e2e), rel=1e-12)
    assert lat["request_latency"]["p90"] == pytest.approx(np.percentile(e2e, 90), rel=1e-12)
    ttft = (r1["first_token"] - r1["arrival"]).to_numpy()
    assert lat["time_to_first_token"]["max"] == pytest.approx(ttft.max(), rel=1e-12)
    tpot = ((r1["finish"] - r1["first_token"]) / 9).to_numpy()
    assert lat["inter_token_latency"]["mean"] == pytest.approx(tpot.mean(), rel=1e-9)
    assert stage1["load_summary"]["count"] == 4 and stage1["load_summary"]["requested_rate"] == 1
    assert stage1["load_summary"]["schedule_delay"]["max"] == pytest.approx(0, abs=1e-9)
    assert stage1["successes"]["prompt_len"]["mean"] == 121
    assert stage1["failures"] == {"count": 0, "request_latency": None, "prompt_len": None}
    assert summary["load_summary"]["count"] == 14 and summary["successes"]["count"] == 14
    span = req["finish"].max() - req["arrival"].min()
    assert summary["successes"]["throughput"]["output_tokens_per_sec"] == pytest.approx(
        140 / span, rel=1e-12)


def test_shipped_example_scenario_validates_and_runs(tmp_path, capsys):
    assert main(["run", "llama2_7b_h100_inference_perf", "--out", str(tmp_path),
                 "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "class.stage1.num_finished" in out
    v = orcasim.load_scenario("llama2_7b_h100_inference_perf").variants[0]
    assert v.memory.gpu_memory_utilization == 0.9
    body = json.loads((tmp_path / "inference_perf" / "vllm-v1" /
                       "stage_0_lifecycle_metrics.json").read_text())
    assert body["successes"]["count"] == 60 and body["failures"]["count"] == 0


@pytest.mark.parametrize("config,msg", [
    (with_(SHARED, data={"type": "shareGPT"}),
     "workload.config: inline config: data: type 'shareGPT' is not simulated (shared_prefix, "
     "random, synthetic)"),
    (with_(SHARED, load={"type": "constant"}), "load.stages: Field required"),
    (with_(SHARED, load={"type": "concurrent", "stages": [{"rate": 1, "duration": 1}]}),
     "load.type: Input should be 'constant' or 'poisson'"),
    (with_(SHARED, load={"stages": [{"rate": 1, "duraton": 5}]}),
     "load.stages.0.duration: Field required"),
    (with_(SHARED, load={"stages": [{"rate": 1, "duration": 1}], "sweep": {"type": "linear"}}),
     "'sweep' (stages found by probing the server) is not simulated"),
    (with_(SHARED, server__ignore_eos=False), "server.ignore_eos is false"),
    (with_(SHARED, data={"type": "shared_prefix", "shared_prefix": {"question_len": -3}}),
     "question_len must be >= 0"),
    (with_(SHARED, data={"type": "random", "input_distribution": {"min": 9, "max": 3}}),
     "min (9) cannot be greater than max (3)"),
    (with_(SHARED, data={"type": "shared_prefix", "shared_prefix": {"output_len": 0}}),
     "output lengths must be >= 1"),
    ("no/such/profile.yaml", "inference-perf config 'no/such/profile.yaml' not found"),
])
def test_bad_configs_are_one_line_errors_exit_2(tmp_path, capsys, config, msg):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump({
        "workload": {"type": "inference_perf", "config": config},
        "engine": {"latency": {"type": "constant", "step_time": 0.01}},
        "policy": {"type": "vllm-v1", "num_blocks": 100}}))
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert msg in err


def test_bad_yaml_file_is_named(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("load: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"profile\.yaml: not a YAML file"):
        scenario(str(path))
