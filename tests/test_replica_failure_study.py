"""The replica-failure study's own code on a small run."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import ROOT

import orcasim


@pytest.fixture(scope="module")
def study():
    path = ROOT / "docs" / "studies" / "replica_failure.py"
    spec = importlib.util.spec_from_file_location("replica_failure", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ttft_by_second_and_table(study):
    reqs = [{"arrival": t, "prompt_len": 4, "output_len": 1} for t in (0.2, 0.7, 1.5)]
    sc = orcasim.Scenario({"workload": {"type": "list", "requests": reqs},
                           "engine": {"latency": {"type": "linear", "base": 1.0,
                                                  "per_seq": 0, "per_token": 0}},
                           "policy": {"type": "continuous", "max_batch": 8},
                           "cluster": {"groups": [{"count": 1}]}})
    (v,) = orcasim.simulate(sc).values()
    curve = study.ttft_by_second(v, 3)
    # 1 s steps from the first arrival: 0.2 -> 1.2 (TTFT 1.0); 0.7 joins at 1.2 -> 2.2 (1.5);
    # 1.5 joins at 2.2 -> 3.2 (1.7)
    assert curve[0] == pytest.approx(np.percentile([1.0, 1.5], 90))
    assert curve[1] == pytest.approx(1.7) and np.isnan(curve[2])
    text = study.markdown({"retry": {"retried": [2, 4], "aborted": [0, 0], "finished": [9, 9],
                                     "ttft_p99": [1.0, 1.0], "worst_p90": [0.5, 0.5]}})
    assert "| retry | 3.00 ± 12.71 | 0.00 ± 0.00 | 9.00 ± 0.00 | 1.00 ± 0.00 |" in text


def test_the_shipped_scenario_fails_r1_for_8_seconds():
    cfg = orcasim.load_scenario("replica_failure").variant("no-retry")
    ev = cfg.cluster.faults.events[0]
    assert (ev.replica, ev.at, ev.repair_after) == ("r-1", 8, 8)
    assert cfg.cluster.faults.max_retries == 0
