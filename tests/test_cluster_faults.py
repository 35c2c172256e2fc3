"""Replica failures: exact schedules with and without retry, random faults, conservation."""

from __future__ import annotations

import pytest

from orcasim.scenario import Scenario
from orcasim.simulation import simulate

UNIT = {"latency": {"type": "linear", "base": 1.0, "per_seq": 0, "per_token": 0}}
FAIL = {
    "name": "fail", "engine": UNIT, "policy": {"type": "continuous", "max_batch": 8},
    "workload": {"type": "list", "requests": [
        {"name": "A", "arrival": 0, "prompt_len": 4, "output_len": 4},
        {"name": "B", "arrival": 0, "prompt_len": 4, "output_len": 4},
        {"name": "C", "arrival": 2.5, "prompt_len": 4, "output_len": 2},
        {"name": "D", "arrival": 3.5, "prompt_len": 4, "output_len": 1}]},
    "cluster": {"router": "round_robin", "routing_log": True,
                "groups": [{"name": "r", "count": 2}],
                "faults": {"events": [{"replica": "r-1", "at": 2.5, "repair_after": 3}],
                           "health_check_delay": 1.5, "max_retries": 1}},
}


def _run(raw, **over):
    sc = Scenario(raw).override(over) if over else Scenario(raw)
    (v,) = simulate(sc).values()
    return v


def test_failure_with_retry_exact_schedule():
    v = _run(FAIL)
    df = v.requests
    # r-1 fails at 2.5 holding B (2 tokens out, its step in flight lost); D is sent there at
    # 3.5 before the router notices at 4.0; both are retried on r-0 from their prompts
    assert v.routing["id"].tolist() == [0, 1, 2, 3, 1, 3]
    assert v.routing["replica"] == ["r-0", "r-1", "r-0", "r-1", "r-0", "r-0"]
    assert v.routing["time"].tolist() == [0, 0, 2.5, 3.5, 4.0, 4.0]
    assert df["state"].tolist() == ["finished"] * 4
    assert df["first_token"].tolist() == [1.0, 5.0, 4.0, 5.0]
    assert df["finish"].tolist() == [4.0, 8.0, 5.0, 5.0]
    s = v.summary
    assert (s["num_replica_failures"], s["num_retries"], s["replica_downtime_s"]) == (1, 2, 3.0)
    # r-0 busy 0..8; r-1 busy 0..2 plus the lost half step
    assert s["gpu_busy_seconds"] == 10.5


def test_failure_without_retry_aborts_replica_failed():
    v = _run(FAIL, **{"cluster.faults.max_retries": 0})
    df = v.requests
    assert df["state"].tolist() == ["finished", "aborted", "finished", "aborted"]
    assert df["reason"].tolist()[1] == df["reason"].tolist()[3] == "replica_failed"
    assert df["finish"].tolist() == [4.0, 4.0, 5.0, 4.0]  # aborted when the router notices
    assert v.summary["aborted_replica_failed"] == 2 and v.summary["num_retries"] == 0


def test_every_replica_down_without_repair_aborts_the_rest():
    raw = {**FAIL, "cluster": {**FAIL["cluster"], "faults": {
        "events": [{"replica": "r-0", "at": 0.5}, {"replica": "r-1", "at": 0.5}],
        "health_check_delay": 0.0, "max_retries": 3}}}
    v = _run(raw)
    assert v.requests["state"].tolist() == ["aborted"] * 4
    assert v.summary["num_finished"] == 0 and v.summary["aborted_replica_failed"] == 4


@pytest.mark.parametrize("policy", [{"type": "continuous", "max_batch": 8},
                                    {"type": "vllm-v1", "num_blocks": 400, "block_size": 16,
                                     "max_num_seqs": 8, "max_num_batched_tokens": 256}])
def test_random_faults_conserve_requests(policy):
    raw = {"name": "rf", "seed": 2, "policy": policy,
           "workload": {"type": "synthetic", "num_requests": 300,
                        "arrival": {"type": "poisson", "rate": 40},
                        "prompt_len": {"type": "uniform", "low": 8, "high": 200},
                        "output_len": {"type": "uniform", "low": 4, "high": 60}},
           "cluster": {"router": "least_outstanding", "groups": [{"count": 4}],
                       "faults": {"random": {"mttf": 2.0, "mttr": 1.0},
                                  "health_check_delay": 0.2, "max_retries": 2}}}
    (v,) = simulate(Scenario(raw)).values()
    s = v.summary
    assert s["num_replica_failures"] > 3 and s["num_retries"] > 0
    assert s["num_finished"] + s["num_aborted"] == 300
    (again,) = simulate(Scenario(raw)).values()  # same seed: the same failures and retries
    assert again.requests.equals(v.requests)


def test_a_scoring_router_avoids_a_replica_it_knows_is_down():
    reqs = [{"name": f"x{k}", "arrival": 3.0 + 2 * k, "prompt_len": 4, "output_len": 1}
            for k in range(3)]
    raw = {**FAIL, "workload": {"type": "list", "requests": reqs},
           "cluster": {"router": "least_outstanding", "routing_log": True,
                       "groups": [{"name": "r", "count": 3}],
                       "faults": {"events": [{"replica": "r-0", "at": 1.0}],
                                  "health_check_delay": 0.5}}}
    v = _run(raw)
    # r-0 looks emptiest (ties go to index 0) but is down: the best healthy score wins
    assert v.routing["replica"] == ["r-1", "r-1", "r-1"]
    assert v.requests["state"].tolist() == ["finished"] * 3


def test_client_patience_with_faults_is_refused():
    from orcasim.errors import ScenarioError

    raw = {**FAIL, "clients": {"patience": 5.0}}
    with pytest.raises(ScenarioError, match="client patience and timeouts are not supported"):
        simulate(Scenario(raw))
