"""The autoscaling study's own code: the table from per-seed values, and its scenario."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

import orcasim


@pytest.fixture(scope="module")
def study():
    path = ROOT / "docs" / "studies" / "autoscaling.py"
    spec = importlib.util.spec_from_file_location("autoscaling_study", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_and_markdown(study):
    table = study.rows({"a": {"gpu_seconds": [100.0, 120.0], "slo_attainment": [0.5, 0.7],
                              "ttft_p90": [1.0, 1.0], "num_scale_ups": [2.0, 2.0]}})
    (r,) = table
    assert r["gpu_seconds"] == 110.0 and r["slo_attainment"] == pytest.approx(0.6)
    assert "| a | 110 ± 127 | 60.0 ± 127.1 | 1.00 ± 0.00 | 2.0 ± 0.0 |" in study.markdown(table)


def test_the_scenario_scales_on_ttft_within_the_pool():
    sc = orcasim.load_scenario("autoscaling")
    assert sc.variant("always-8").cluster.autoscaling is None
    a = sc.variant("ttft-0.5s").cluster.autoscaling
    assert (a.metric, a.target, a.cold_start, a.min) == ("ttft", 0.5, 10, 1)
    assert sc.variant("ttft-2s").cluster.num_replicas == 8
