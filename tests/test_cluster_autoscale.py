"""Autoscaling: an exact scale-up / drain timeline, GPU-seconds, config errors."""

from __future__ import annotations

import pytest

from orcasim.errors import ScenarioError
from orcasim.scenario import Scenario
from orcasim.simulation import simulate

SCALE = {
    "name": "scale", "policy": {"type": "continuous", "max_batch": 1},
    "engine": {"latency": {"type": "linear", "base": 1.0, "per_seq": 0, "per_token": 0}},
    "workload": {"type": "list", "requests": [
        *({"name": n, "arrival": 0, "prompt_len": 4, "output_len": 3} for n in "ABCD"),
        *({"name": n, "arrival": 4.5, "prompt_len": 4, "output_len": 3} for n in "EF")]},
    "cluster": {"router": "least_outstanding", "groups": [{"name": "r", "count": 3}],
                "autoscaling": {"min": 1, "max": 3, "metric": "queue", "target": 1.5,
                                "interval": 1, "cold_start": 2}},
}


def test_scale_up_drain_and_gpu_seconds_exact():
    (v,) = simulate(Scenario(SCALE)).values()
    # one slot per replica, 3 s per request: B, C, D queue on r-0 (3 waiting > 1.5) -> start
    # r-1 at 1 and r-2 at 2 (cold start 2 s); at 4, 2 waiting over 3 replicas < 0.75 ->
    # drain r-2 (idle: stops at once); E, F go to r-1; at 8, 1 waiting over 2 -> drain r-1,
    # which stops when F ends at 10.5
    tl = list(zip(v.scaling["time"].tolist(), v.scaling["replica"], v.scaling["event"],
                  strict=True))
    assert tl == [(1.0, "r-1", "start"), (2.0, "r-2", "start"), (3.0, "r-1", "serving"),
                  (4.0, "r-2", "serving"), (4.0, "r-2", "drain"), (4.0, "r-2", "stop"),
                  (8.0, "r-1", "drain"), (10.5, "r-1", "stop")]
    assert v.requests["replica"].tolist() == ["r-0"] * 4 + ["r-1"] * 2
    assert v.requests["finish"].tolist() == [3.0, 6.0, 9.0, 12.0, 7.5, 10.5]
    s = v.summary
    assert s["gpu_seconds"] == 12.0 + 9.5 + 2.0  # r-0 all run, r-1 1..10.5, r-2 2..4
    assert (s["num_scale_ups"], s["num_scale_downs"]) == (2, 2)
    assert s["gpu_busy_seconds"] == 18.0


def test_ttft_scaler_conserves_requests_on_a_poisson_load():
    raw = {"name": "t", "seed": 1, "policy": {"type": "continuous", "max_batch": 8},
           "workload": {"type": "synthetic", "num_requests": 400,
                        "arrival": {"type": "poisson", "rate": 30},
                        "prompt_len": {"type": "uniform", "low": 8, "high": 200},
                        "output_len": {"type": "uniform", "low": 4, "high": 80}},
           "cluster": {"router": "least_outstanding", "groups": [{"count": 6}],
                       "autoscaling": {"min": 1, "metric": "ttft", "target": 0.5,
                                       "window": 2, "interval": 0.5, "cold_start": 1}}}
    (v,) = simulate(Scenario(raw)).values()
    s = v.summary
    assert s["num_finished"] == 400 and s["num_scale_ups"] >= 1
    assert 0 < s["gpu_seconds"] < 6 * s["makespan_s"]


@pytest.mark.parametrize("over,message", [
    ({"max": 4}, "cluster.autoscaling.max: 4 replicas, but the groups have 3"),
    ({"min": 2, "initial": 1}, "cluster.autoscaling: needs min <= initial <= max"),
    ({"target": 0}, "cluster.autoscaling.target: Input should be greater than 0"),
])
def test_bad_autoscaling_is_refused(over, message):
    raw = {**SCALE, "cluster": {**SCALE["cluster"],
                                "autoscaling": {**SCALE["cluster"]["autoscaling"], **over}}}
    with pytest.raises(ScenarioError) as err:
        Scenario(raw)
    assert message in str(err.value)
