"""Clusters: a one-replica cluster equals the single engine bit for bit; exact routing
schedules on hand-checkable workloads; cluster-level admission; conservation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orcasim.cluster.model import build_cluster_model, check_cluster_conservation
from orcasim.errors import SimulationError
from orcasim.scenario import Scenario
from orcasim.simulation import generate_workload, simulate

SYNTH = {"type": "synthetic", "num_requests": 150, "arrival": {"type": "poisson", "rate": 30},
         "prompt_len": {"type": "uniform", "low": 10, "high": 300},
         "output_len": {"type": "uniform", "low": 5, "high": 120}}
MOONCAKE = {"type": "trace", "file": "mooncake_conversation", "max_requests": 60,
            "speedup": 0.5}
VLLM = {"type": "vllm-v1", "num_blocks": 2000, "block_size": 16, "max_num_seqs": 16,
        "max_num_batched_tokens": 2048, "max_model_len": 131072}
UNIT = {"latency": {"type": "linear", "base": 1.0, "per_seq": 0, "per_token": 0}}


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        nan = a.dtype.kind == "f"
        return a.dtype == np.asarray(b).dtype and np.array_equal(a, b, equal_nan=nan)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@pytest.mark.parametrize("workload,policy,memory", [
    (SYNTH, {"type": "continuous", "max_batch": 8}, None),
    (SYNTH, {"type": "sarathi", "max_batch": 8, "token_budget": 64}, None),
    (MOONCAKE, VLLM, None),
    (SYNTH, {"type": "continuous", "max_batch": 16, "prefill": True},
     {"model": "opt-13b", "gpu": "a100-40gb", "block_size": 16}),
])
def test_one_replica_cluster_is_the_single_engine_bit_for_bit(workload, policy, memory):
    raw = {"name": "x", "seed": 3, "workload": workload, "policy": policy,
           "engine": {"latency": {"type": "roofline", "model": "llama-3.1-8b",
                                  "gpu": "h100-80gb"}}}
    if memory is not None:
        raw["memory"] = memory
    single = simulate(Scenario(raw))["vllm-v1" if policy["type"] == "vllm-v1" else
                                     policy["type"]]
    cluster = simulate(Scenario({**raw, "cluster": {"groups": [{"count": 1}]}}))
    (c,) = cluster.values()
    assert c.summary["num_replicas"] == 1
    assert set(c.columns) == set(single.columns) | {"replica"}
    for k, v in single.columns.items():
        assert _same(v, c.columns[k]), k
    assert all(r == "g0" for r in c.columns["replica"])
    for k, v in single.summary.items():
        assert _same(v, c.summary[k]), k
    for a, b in zip(single.itl, c.itl, strict=True):
        assert np.array_equal(a, b)
    for k, v in single.series.items():
        assert np.array_equal(v, c.series[k]), k
    assert single.summary["num_finished"] > 0


TWO = {
    "name": "two", "engine": UNIT, "policy": {"type": "continuous", "max_batch": 8},
    "workload": {"type": "list", "requests": [
        {"name": "A", "arrival": 0, "prompt_len": 4, "output_len": 3},
        {"name": "B", "arrival": 0, "prompt_len": 4, "output_len": 1},
        {"name": "C", "arrival": 0.5, "prompt_len": 4, "output_len": 2},
        {"name": "D", "arrival": 0.5, "prompt_len": 4, "output_len": 1},
        {"name": "E", "arrival": 1.5, "prompt_len": 4, "output_len": 1}]},
}


def _run(router, staleness=0.0, log=True, **extra):
    raw = {**TWO, "cluster": {"router": router, "staleness": staleness, "routing_log": log,
                              "groups": [{"name": "r", "count": 2}], **extra}}
    (v,) = simulate(Scenario(raw)).values()
    return v


def test_round_robin_exact_schedule():
    v = _run("round_robin")
    df = v.requests
    assert df["replica"].tolist() == ["r-0", "r-1", "r-0", "r-1", "r-0"]
    # 1 s steps; r-0 runs A, then A+C from t=1 (C arrived mid-step), E joins at t=2
    assert df["first_token"].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0]
    assert df["finish"].tolist() == [3.0, 1.0, 3.0, 2.0, 3.0]
    s = v.summary
    assert s["num_steps"] == 5 and s["gpu_busy_seconds"] == 5.0 and s["gpu_seconds"] == 6.0
    assert s["replica.r-0.routed_share"] == 0.6 and s["replica.r-1.num_finished"] == 2
    # outstanding after each decision: [1,0] [1,1] [2,1] [2,2] [3,1] -> max/mean 2,1,4/3,1,3/2
    assert s["load_imbalance"] == pytest.approx((2 + 1 + 4 / 3 + 1 + 1.5) / 5)


def test_least_outstanding_sends_e_to_the_emptier_replica():
    v = _run("least_outstanding")
    assert v.requests["replica"].tolist() == ["r-0", "r-1", "r-0", "r-1", "r-1"]
    # at t=1.5 B has finished: r-0 holds A and C, r-1 holds D
    assert v.routing["scores"][-1] == "0 1"
    assert v.requests["finish"].tolist() == [3.0, 1.0, 3.0, 2.0, 3.0]
    assert v.summary["num_steps"] == 6


def test_stale_view_herds_every_request_onto_one_replica():
    # scraped at t=0 (all idle) and next at t=10: every decision sees zero load
    v = _run("least_outstanding", staleness=10.0)
    assert v.requests["replica"].tolist() == ["r-0"] * 5
    v = _run("least_outstanding", staleness=1.0)  # scrapes at 0 and 1: E sees A, C, D (B ended)
    assert v.requests["replica"].tolist() == ["r-0"] * 4 + ["r-1"]


def test_power_of_d_with_every_replica_is_least_loaded_and_random_is_seeded():
    assert _run({"type": "power_of_d", "d": 2}).requests["replica"].tolist() == \
        _run("least_outstanding").requests["replica"].tolist()
    a = _run("random").requests["replica"].tolist()
    assert a == _run("random").requests["replica"].tolist()
    raw = {**TWO, "workload": SYNTH, "cluster": {"router": "random",
                                                 "groups": [{"count": 4}]}}
    seeds = [simulate(Scenario(raw), seed=s)["continuous"].requests["replica"].tolist()
             for s in (0, 1)]
    assert seeds[0] != seeds[1] and set(seeds[0]) == {"g0-0", "g0-1", "g0-2", "g0-3"}


def _prefix_requests(n, arrival=0.0, prefix="P"):
    return [{"name": f"{prefix}{k}", "arrival": arrival, "prompt_len": 64, "output_len": 1,
             "prefix_id": prefix, "prefix_len": 48} for k in range(n)]


@pytest.mark.parametrize("load_factor,expect", [(1.0, [0, 1, 0, 1]), (2.0, [0, 0, 0, 0])])
def test_prefix_affinity_bounded_load(load_factor, expect):
    raw = {**TWO, "workload": {"type": "list", "requests": _prefix_requests(4)},
           "cluster": {"router": {"type": "prefix_affinity", "load_factor": load_factor},
                       "groups": [{"name": "r", "count": 2}]}}
    (v,) = simulate(Scenario(raw)).values()
    homes = v.requests["replica"].tolist()
    home = homes[0]
    other = "r-1" if home == "r-0" else "r-0"
    # cap = ceil(load_factor * (outstanding + 1) / 2): 1.0 alternates, 2.0 keeps the home
    assert homes == [home if e == 0 else other for e in expect]


@pytest.mark.parametrize("abs_threshold,expect", [(64, [0, 0, 0, 0]), (1, [0, 0, 1, 0])])
def test_prefix_affinity_leaves_its_home_only_when_the_cluster_is_imbalanced(abs_threshold,
                                                                               expect):
    router = {"type": "prefix_affinity", "balance_abs_threshold": abs_threshold,
              "balance_rel_threshold": 1.5}
    raw = {**TWO, "workload": {"type": "list", "requests": _prefix_requests(4)},
           "cluster": {"router": router, "groups": [{"name": "r", "count": 2}]}}
    (v,) = simulate(Scenario(raw)).values()
    homes = v.requests["replica"].tolist()
    other = "r-1" if homes[0] == "r-0" else "r-0"
    # outstanding (home, other) before each request: (0,0) (1,0) (2,0) (2,1); only (2,0) has
    # max - min > 1 and max > 1.5 * min, so the third request goes to the least loaded
    assert homes == [homes[0] if e == 0 else other for e in expect]


def _kv_scenario(router):
    reqs = [{"name": "A", "arrival": 0, "prompt_len": 64, "output_len": 2, "prefix_id": "P",
             "prefix_len": 48},
            {"name": "B", "arrival": 10, "prompt_len": 64, "output_len": 2, "prefix_id": "P",
             "prefix_len": 48}]
    return {"name": "kv", "engine": UNIT, "workload": {"type": "list", "requests": reqs},
            "policy": VLLM, "cluster": {"router": router, "routing_log": True,
                                        "groups": [{"name": "r", "count": 2}]}}


def test_kv_overlap_follows_the_cached_prefix_and_round_robin_misses_it():
    (rr,) = simulate(Scenario(_kv_scenario("round_robin"))).values()
    (kv,) = simulate(Scenario(_kv_scenario("kv_overlap"))).values()
    assert rr.requests["replica"].tolist() == ["r-0", "r-1"]
    assert kv.requests["replica"].tolist() == ["r-0", "r-0"]
    # B's prompt: 3 full 16-token blocks of the shared prefix are cached on r-0 (48 tokens)
    assert kv.routing["scores"] == ["0 0", "48 0"]
    assert kv.summary["prefix_cache_hit_tokens"] == 48
    assert kv.summary["prefix_cache_hit_rate"] == 48 / 128
    assert rr.summary["prefix_cache_hit_tokens"] == 0
    assert kv.summary["replica.r-0.prefix_cache_hit_rate"] == 48 / 128


def test_weighted_scores_add_up():
    router = {"type": "weighted", "scorers": [{"type": "prefix_cache", "weight": 2.0},
                                             {"type": "least_outstanding", "weight": 1.0}]}
    (v,) = simulate(Scenario(_kv_scenario(router))).values()
    # A: no cache anywhere, equal load (1 each); B: prefix share 48/64 on r-0 (x2) + 1
    assert v.routing["scores"] == ["1 1", "2.5 1"]
    assert v.requests["replica"].tolist() == ["r-0", "r-0"]


def test_cluster_admission_counts_every_replicas_queue():
    v = _run("round_robin", admission=[{"type": "max_queue", "limit": 1}])
    df = v.requests
    # at t=0 A waits on r-0 when B arrives (1 waiting): B is rejected; at 0.5 nothing waits
    assert df["state"].tolist() == ["finished", "rejected", "finished", "rejected", "finished"]
    assert df["reason"].tolist()[1] == "queue_full"
    assert v.columns["replica"] == ["r-0", None, "r-1", None, "r-0"]
    assert v.summary["num_rejected"] == 2


def test_conservation_check_catches_a_lost_request():
    sc = Scenario({**TWO, "cluster": {"groups": [{"count": 2}]}})
    cfg = sc.variants[0]
    arrays = generate_workload(cfg)
    m = build_cluster_model(cfg, arrays)
    m.env.run()
    check_cluster_conservation(cfg, m, len(arrays))
    with pytest.raises(SimulationError, match="lost or double-counted"):
        check_cluster_conservation(cfg, m, len(arrays) + 1)
