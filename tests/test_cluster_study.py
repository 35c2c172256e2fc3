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
