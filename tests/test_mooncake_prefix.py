"""The Mooncake prefix-caching scenario: real hash_ids reuse, cache on vs off."""

from __future__ import annotations

import numpy as np

import orcasim
from orcasim.workload.traces import load_trace


def ideal_hit_rate(n: int) -> float:
    """Prompt tokens an unbounded prefix cache would serve, from the trace's hash_ids alone."""
    trace = load_trace("mooncake_conversation")
    seen: set[int] = set()
    hit = total = 0
    for i in range(n):
        prompt = int(trace.prompt_len[i])
        ids = trace.hash_ids[i]
        total += prompt
        # vLLM recomputes at least the last prompt token, and reuse stops at the first miss
        usable = (prompt - 1) // 16 * 16
        covered = 0
        for j, h in enumerate(ids):
            if h not in seen:
                break
            covered = min((j + 1) * 512, usable)
        hit += covered
        seen.update(ids)
    return hit / total


def test_prefix_cache_hits_and_cuts_ttft():
    sc = orcasim.load_scenario("mooncake_prefix").override({"workload.max_requests": 300})
    s = orcasim.simulate(sc).summary
    on, off = s["prefix-cache"], s["no-prefix-cache"]
    assert on["num_finished"] == off["num_finished"] == 300
    assert off["prefix_cache_hit_rate"] == 0.0
    assert on["prefix_cache_hit_rate"] > 0.02
    assert on["ttft_p50"] < off["ttft_p50"]


def test_unbounded_cache_reaches_the_trace_ideal():
    n = 200
    sc = orcasim.load_scenario("mooncake_prefix").override(
        {"workload.max_requests": n, "policy.num_blocks": 2_000_000})
    s = orcasim.simulate(sc, variants=["prefix-cache"]).summary["prefix-cache"]
    assert np.isclose(s["prefix_cache_hit_rate"], ideal_hit_rate(n), rtol=0, atol=1e-12)
