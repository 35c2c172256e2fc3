"""The disaggregation study's own code (the table from per-seed values) and its scenario."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from conftest import ROOT

import orcasim


@pytest.fixture(scope="module")
def study():
    path = ROOT / "docs" / "studies" / "disaggregation.py"
    spec = importlib.util.spec_from_file_location("disaggregation_study", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summarize_and_markdown(study):
    df = pd.DataFrame({"variant": ["2p2d"] * 2, "workload.arrival.rate": [16, 16],
                       "seed": [0, 1], "goodput_req_s_per_gpu": [2.0, 3.0],
                       "slo_attainment": [0.5, 0.7]})
    (r,) = study.summarize(df, ["variant", "workload.arrival.rate"])
    assert r["seeds"] == 2 and r["goodput_req_s_per_gpu"] == 2.5
    assert r["slo_attainment"] == pytest.approx(0.6)
    assert study.ci(r, "goodput_req_s_per_gpu") == "2.50 ± 6.35"


def test_every_variant_uses_the_same_four_gpus():
    sc = orcasim.load_scenario("disaggregation")
    for cfg in sc.variants:
        assert sum(g.count for g in cfg.cluster.groups) == 4
        assert (cfg.cluster.link is None) == (cfg.name == "colocated")
    assert sc.variant("3p1d").cluster.groups[0].role == "prefill"
    slo = sc.variants[0].metrics.slo
    assert (slo.ttft, slo.tpot) == (1.0, 0.015)


def test_decode_replicas_escape_prefill_interference():
    # 40 long prompts at 16 req/s: colocated replicas mix 8192-token prefill chunks into
    # their decode steps; dedicated decode replicas do not
    sc = orcasim.load_scenario("disaggregation").override(
        {"workload.num_requests": 40, "workload.arrival.rate": 16})
    res = orcasim.simulate(sc, variants=["colocated", "2p2d"])
    colo, pd_ = res["colocated"].summary, res["2p2d"].summary
    for s in (colo, pd_):
        assert s["num_finished"] == 40
        assert s["goodput_req_s_per_gpu"] == pytest.approx(s["goodput_req_s"] / 4)
    assert pd_["num_kv_transfers"] == 40 and colo.get("num_kv_transfers", 0) == 0
    # the colocated tail breaks the 15 ms TPOT SLO (4 of 40 requests); the split one does not
    assert pd_["tpot_p99"] < 0.01 and colo["tpot_p99"] > 0.015
    assert colo["slo_attainment"] == 36 / 40 and pd_["slo_attainment"] == 1.0
