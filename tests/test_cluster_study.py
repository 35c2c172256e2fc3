"""The cluster prefix-routing study's own code: the ideal hit rate and the table."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def study():
    path = ROOT / "docs" / "studies" / "cluster_prefix_routing.py"
    spec = importlib.util.spec_from_file_location("cluster_prefix_routing", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ideal_hit_rate_counts_leading_blocks_seen_before(study):
    # [0, 1] then [0, 1, 2]: 2 blocks of 4 tokens hit; [5] is new; [0, 9]: block 0 hits
    ids = [[0, 1], [0, 1, 2], [5], [0, 9]]
    lens = [8, 12, 4, 8]
    assert study.ideal_hit_rate(ids, lens, hash_block_size=4) == (8 + 4) / 32


def test_the_shipped_slice_has_a_13_7_percent_ceiling(study):
    assert study.scenario_ideal() == pytest.approx(0.137, abs=0.0005)


def test_table_means_and_intervals(study):
    df = pd.DataFrame({"variant": ["kv_overlap"] * 3, "cluster.staleness": [0.0] * 3,
                       "seed": [1, 2, 3], "prefix_cache_hit_rate": [0.1, 0.2, 0.3],
                       "ttft_p50": [1.0] * 3, "ttft_p99": [2.0] * 3,
                       "load_imbalance": [1.5] * 3})
    (row,) = study.table(df)
    assert row["seeds"] == 3 and row["prefix_cache_hit_rate"] == pytest.approx(0.2)
    assert row["prefix_cache_hit_rate_lo"] < 0.2 < row["prefix_cache_hit_rate_hi"]
    text = study.markdown([row], 0.137)
    assert "| 0 ms | kv_overlap | 20.0 ± 24.8 |" in text


def test_probe_separates_routing_from_eviction():
    path = ROOT / "docs" / "studies" / "cluster_prefix_routing_probe.py"
    spec = importlib.util.spec_from_file_location("cluster_prefix_routing_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    few = ["workload.max_requests=140"]  # three follow-up turns (133, 134, 137)
    pa = mod.probe("prefix_affinity", 0, few)
    rr = mod.probe("round_robin", 0, few)
    # the same requests: the prefix sent before is the router's, not the cache's, figure
    assert pa["sent_before"] == rr["sent_before"] > 0
    assert pa["requests_with_known_prefix"] == rr["requests_with_known_prefix"] > 0
    # SGLang's imbalance test never fires on 8 replicas with a few requests each: the ring
    # keeps every conversation together; round-robin scatters some
    assert pa["fallback_overrides"] == 0 and pa["sent_elsewhere"] == 0
    assert rr["sent_elsewhere"] > 0 and "fallback_overrides" not in rr
    for r in (pa, rr):
        assert r["chosen_cached"] <= r["best_cached"] <= r["sent_before"]
        assert r["hit_rate"] <= r["chosen_cached"] + 1e-12
