"""Engine-level guarantees: conservation, stalls end with a clear error, bounded step series."""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.metrics.series import StepSeries
from orcasim.policies.base import DecodeOnlyPolicy, PolicyParams
from orcasim.registry import policies


@policies.register("test-never-admits")
class NeverAdmits(DecodeOnlyPolicy):
    """Holds every request forever (a broken policy, for the stall check)."""

    class Params(PolicyParams):
        pass

    def admit(self) -> None:
        return None


def test_a_stalled_policy_is_a_clear_error():
    sc = orcasim.load_scenario().override({"policy": {"type": "test-never-admits"},
                                           "variants": None, "workload.num_requests": 5})
    with pytest.raises(orcasim.SimulationError, match=r"stalled .* 5 waiting and 0 running"):
        orcasim.simulate(sc)


def test_every_request_ends_in_one_state():
    res = orcasim.simulate(orcasim.load_scenario().override({"workload.num_requests": 200}))
    for v in res.values():
        s = v.summary
        assert s["num_requests"] == 200
        assert s["num_finished"] + s["num_rejected"] + s["num_aborted"] == 200
        assert sorted(v.requests["id"]) == list(range(200))


def test_series_is_exact_when_short_and_bounded_when_long():
    s = StepSeries(capacity=16)
    for i in range(10):
        s.add(float(i), i + 0.5, i, 10 * i, 1)
    rows = s.rows()
    assert rows["batch_size"].tolist() == list(range(10))
    assert rows["num_steps"].tolist() == [1] * 10
    s = StepSeries(capacity=16)
    n = 1000
    for i in range(n):
        s.add(float(i), i + 1.0, i % 7, 1, i % 3)
    rows = s.rows()
    assert len(rows["t_start"]) <= 32
    assert rows["num_steps"].sum() == n
    assert rows["busy"].sum() == pytest.approx(n)
    # time-weighted means integrate back to the exact totals
    assert float(np.dot(rows["batch_size"], rows["busy"])) == pytest.approx(
        sum(i % 7 for i in range(n)))
    assert rows["t_start"][0] == 0.0 and rows["t_end"][-1] == float(n)


def test_long_run_keeps_the_series_bounded():
    sc = orcasim.load_scenario().override({"workload.num_requests": 3000,
                                           "output.series_capacity": 64})
    v = orcasim.simulate(sc, variants=["continuous"])["continuous"]
    assert v.summary["num_steps"] > 1000
    assert len(v.series["t_start"]) <= 128
    assert v.series["num_steps"].sum() == v.summary["num_steps"]


def test_prefill_option_charges_prompts_in_the_first_step():
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [
            {"name": "A", "prompt_len": 10, "output_len": 2},
            {"name": "B", "prompt_len": 4, "output_len": 1, "arrival": 0.5}]},
        "engine": {"latency": {"type": "linear", "base": 1.0, "per_seq": 0.0, "per_token": 0.01,
                               "per_prefill_token": 0.1}},
        "policy": {"type": "continuous", "max_batch": 4, "prefill": True},
    })
    df = orcasim.simulate(sc)["continuous"].requests.set_index("name")
    # step 1 [0, 2]: A prefill 10 -> 1 + 0.1*10; step 2 [2, 3.5]: A decode (reads 11 KV tokens),
    # B prefill 4 -> 1 + 0.01*11 + 0.1*4
    assert df.loc["A", "first_token"] == 2.0
    assert df.loc["A", "finish"] == pytest.approx(3.51)
    assert df.loc["B", "finish"] == pytest.approx(3.51)
    sc_off = sc.override({"policy.prefill": False})
    df = orcasim.simulate(sc_off)["continuous"].requests.set_index("name")
    assert df.loc["A", "first_token"] == pytest.approx(1.1)  # 1 + 0.01 * 10 KV tokens
