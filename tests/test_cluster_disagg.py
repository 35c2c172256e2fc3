"""Disaggregated prefill/decode: an exact schedule through the link, and refused configs."""

from __future__ import annotations

import pytest

from orcasim.errors import ScenarioError
from orcasim.scenario import Scenario
from orcasim.simulation import simulate

VLLM = {"type": "vllm-v1", "num_blocks": 200, "block_size": 16, "max_num_seqs": 8,
        "max_num_batched_tokens": 512}
PD = {
    "name": "pd", "policy": VLLM,
    "engine": {"latency": {"type": "linear", "base": 1.0, "per_seq": 0, "per_token": 0}},
    "workload": {"type": "list", "requests": [
        {"name": "A", "arrival": 0, "prompt_len": 64, "output_len": 3},
        {"name": "B", "arrival": 0, "prompt_len": 40, "output_len": 2}]},
    "cluster": {"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.25,
                         "bytes_per_token": 1_000_000, "concurrency": 1},
                "groups": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}]},
}


def test_prefill_link_decode_exact_schedule():
    (v,) = simulate(Scenario(PD)).values()
    df = v.requests
    # prefill: both prompts in the step [0, 1], first tokens at 1; the link moves one at a
    # time: A (64 MB) 0.25 + 0.064 s -> 1.314, B waits 0.314 s, then 0.29 s -> 1.604; decode
    # runs A's second token in [1.314, 2.314] (only its last prompt token is computed, the
    # rest is the transferred cache), B joins at 2.314: both finish at 3.314
    assert df["replica"].tolist() == ["d", "d"]
    assert df["first_token"].tolist() == [1.0, 1.0]
    assert df["finish"].tolist() == pytest.approx([3.314, 3.314])
    s = v.summary
    assert s["num_kv_transfers"] == 2 and s["kv_transfer_bytes"] == 104_000_000
    assert s["kv_transfer_wait_mean"] == pytest.approx(0.157)
    assert s["kv_transfer_time_mean"] == pytest.approx(0.302)
    # inter-token gaps: A 1.314 and 1.0, B 2.314 (the transfer and decode queue included)
    assert s["itl_mean"] == pytest.approx((1.314 + 1.0 + 2.314) / 3)
    assert s["replica.p.num_finished"] == 0 and s["replica.d.num_finished"] == 2
    assert s["prefix_cache_hit_rate"] == 0.0  # transferred blocks are not cache hits


def _small_decode():
    return {**PD, "cluster": {**PD["cluster"], "groups": [
        {"name": "p", "role": "prefill"},
        {"name": "d", "role": "decode", "policy": {**VLLM, "num_blocks": 6}}]}}


def test_the_second_request_waits_for_the_decode_replicas_blocks():
    # a decode pool of 5 usable blocks (6 with the null block): A (64 + 1 tokens) reserves
    # all five, so B cannot reserve its 2 full prompt blocks and its tail block until A ends
    raw = _small_decode()
    (v,) = simulate(Scenario(raw)).values()
    df = v.requests
    # prefill: both first tokens at 1. A reserves its 4 full prompt blocks and a tail block
    # at once and moves over the link in 0.25 + 0.064 s -> 1.314; the decode replica runs it
    # (the 4 blocks as cache hits plus the tail block) in [1.314, 2.314] and [2.314, 3.314].
    # B waits for its 3 blocks until A's are freed at 3.314 (2.314 s, holding its prefill
    # blocks), moves in 0.29 s -> 3.604 and runs its second token in [3.604, 4.604]
    assert df["kv_reserve_wait"].tolist() == pytest.approx([0.0, 2.314])
    assert df["kv_link_wait"].tolist() == [0.0, 0.0]
    assert df["kv_transfer_time"].tolist() == pytest.approx([0.314, 0.29])
    assert df["decode_start"].tolist() == pytest.approx([1.314, 3.604])
    assert df["finish"].tolist() == pytest.approx([3.314, 4.604])
    s = v.summary
    assert s["kv_reserve_wait_mean"] == pytest.approx(2.314 / 2)
    assert s["kv_transfer_wait_mean"] == 0.0
    assert s["replica.d.num_preemptions"] == 0  # nothing was evicted and recomputed
    assert s["replica.d.kv_peak_usage"] == 1.0


def test_blocks_are_held_on_both_sides_during_the_transfer():
    from orcasim.cluster.model import build_cluster_model
    from orcasim.simulation import generate_workload

    raw = _small_decode()
    cfg = Scenario(raw).variants[0]
    m = build_cluster_model(cfg, generate_workload(cfg, cfg.seed), seed=cfg.seed)
    p, d = m.replicas
    pre, dec = p.prefix_cache().pool, d.prefix_cache().pool
    m.env.run(until=1.2)  # A in transfer, B waiting for blocks: both hold their prefill blocks
    # (A's 4 full blocks and the one for its last token on the decode replica: all five)
    assert pre.num_held_blocks == 6 and dec.num_held_blocks == 5
    m.env.run(until=3.4)  # A done; B's transfer: its 2 prefill and 2 + 1 decode blocks held
    assert pre.num_held_blocks == 2 and dec.num_held_blocks == 3
    m.env.run()
    assert pre.num_held_blocks == 0 and dec.num_held_blocks == 0


def test_a_one_token_request_ends_on_the_prefill_replica():
    raw = {**PD, "workload": {"type": "list", "requests": [
        {"name": "A", "arrival": 0, "prompt_len": 64, "output_len": 1}]}}
    (v,) = simulate(Scenario(raw)).values()
    assert v.requests["replica"].tolist() == ["p"] and v.summary["num_kv_transfers"] == 0


def _cluster(**over):
    return {**PD, "cluster": {**PD["cluster"], **over}}


@pytest.mark.parametrize("raw,message", [
    (_cluster(groups=[{"role": "prefill"}]),
     "cluster.groups: disaggregation needs a decode group"),
    (_cluster(groups=[{"role": "prefill"}, {"name": "d", "role": "decode"}, {"name": "m"}]),
     "mixed groups cannot serve beside prefill and decode groups yet"),
    (_cluster(link={"bandwidth_gb_s": 0}),
     "cluster.link.bandwidth_gb_s: Input should be greater than 0"),
    (_cluster(link=None), "cluster.link: disaggregated prefill/decode needs a link"),
    (_cluster(link={"preset": "nvlink"}), "cluster.link.bytes_per_token: required"),
    (_cluster(groups=[{"role": "prefill"}, {"name": "d", "role": "decode",
                                             "policy": {"type": "continuous"}}]),
     "cluster.groups.1.policy: decode replicas run vllm-v1"),
])
def test_bad_disaggregation_is_refused(raw, message):
    with pytest.raises(ScenarioError) as err:
        Scenario(raw)
    assert message in str(err.value)


def test_a_decode_group_that_holds_no_request_is_refused():
    raw = _cluster(groups=[{"name": "p", "role": "prefill"},
                           {"name": "d", "role": "decode", "policy": {**VLLM, "num_blocks": 3}}])
    with pytest.raises(ScenarioError, match="decode group 'd' cannot hold any request"):
        simulate(Scenario(raw))


def test_link_sized_from_the_model():
    raw = _cluster(link={"preset": "nvlink"})
    raw["engine"] = {"latency": {"type": "roofline", "model": "llama-3.1-8b",
                                 "gpu": "h100-80gb"}}
    cfg = Scenario(raw).variants[0].cluster
    assert cfg.bytes_per_token == 131072  # 32 layers x 8 KV heads x 128 x 2 x 2 bytes
    (v,) = simulate(Scenario(raw)).values()
    assert v.summary["num_finished"] == 2



def test_per_replica_kv_series_and_the_ttft_breakdown(tmp_path):
    import numpy as np
    import pandas as pd

    from orcasim.metrics.cluster_plots import STAGES, stage_means

    res = simulate(Scenario(_small_decode()))
    (v,) = res.values()
    kv = v.kv_usage
    # one KV row per step of each replica: the prefill step [0, 1] holds both prompts
    # (64 and 40 tokens: 4 + 3 blocks), the decode replica A's two steps (65 and 66 tokens:
    # 5 blocks, its whole pool) and B's (41 tokens: 3 blocks)
    assert kv["replica"].tolist() == ["p", "d", "d", "d"]
    assert kv["t_start"].tolist() == pytest.approx([0.0, 1.314, 2.314, 3.604])
    assert kv["allocated"].tolist() == [112.0, 80.0, 80.0, 48.0]
    assert v.summary["replica.d.kv_capacity_tokens"] == 80
    # stages, means over A and B: no prefill queue, prefill 1 s, reservation (0 + 2.314) / 2,
    # no link queue, transfer (0.314 + 0.29) / 2, and no decode queue
    assert stage_means(v.columns) == pytest.approx([0, 1.0, 1.157, 0, 0.302, 0])
    assert len(STAGES) == 6
    written = res.write(tmp_path)
    assert tmp_path / "ttft_breakdown.png" in written and tmp_path / "replicas.png" in written
    assert tmp_path / "kv_usage.png" not in written  # a cluster's KV is in replicas.png
    csv = pd.read_csv(tmp_path / "kv.csv")
    assert csv["replica"].tolist() == ["p", "d", "d", "d"]
    table = pd.read_parquet(tmp_path / "requests.parquet")
    assert np.allclose(table["kv_reserve_wait"], [0.0, 2.314])


def test_a_request_preempted_on_the_decode_replica_is_not_stuck_behind_reservations():
    # 3 prefill replicas feeding one decode replica over a slow link: the decode replica
    # preempts requests (kv_full) while transfers hold reserved blocks; every request ends
    from importlib import resources

    import yaml

    import orcasim

    raw = yaml.safe_load((resources.files("orcasim.scenarios") / "disaggregation.yaml")
                         .read_text())
    raw["variants"] = {"3p1d": {**raw["variants"]["3p1d"],
                                "cluster.link": {"bandwidth_gb_s": 0.5, "concurrency": 4}}}
    raw["workload"]["arrival"]["rate"] = 16
    (v,) = simulate(orcasim.Scenario(raw), seed=5359369296615874651).values()
    s = v.summary
    assert s["num_finished"] == 150 and s["num_kv_transfers"] == 150
    assert s["replica.d.num_preemptions"] == 2
    assert s["kv_reserve_wait_mean"] == pytest.approx(1.0066190615076696)
