"""vllm-v1's runs of all-decode steps in one event give exactly the per-step results.

Every scenario runs both ways (``Engine.fast_paths``) and compares everything
the run records (request columns, ITL samples, the step and memory series,
busy time), and checks that the fast run did take runs (fewer SimPy events).
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.request import RequestState
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import TOKEN_POLICIES, assert_identical, run_both, snapshot

ROOFLINE = {"type": "roofline", "model": "llama-2-7b", "gpu": "a100-80gb"}
BASE = {"variants": None, "engine.latency": ROOFLINE, "workload.arrival.rate": 10.0}
V1 = {"type": "vllm-v1", "max_num_seqs": 32}

SCENARIOS = {
    # the comparison trace's setting: no prefix cache, plenty of blocks
    "no_cache": {"policy": {**V1, "enable_prefix_caching": False}},
    # prefix caching: blocks filled by decode are hashed and cached during runs
    "cache": {"policy": V1},
    # a small pool and small blocks: runs stop before a crossing finds no block; preemptions
    "tight": {"policy": {**V1, "num_blocks": 300, "block_size": 8},
              "workload.arrival.rate": 20.0},
    # a full batch with a queue: arrivals cannot join, every one still ends a run
    "full": {"policy": {**V1, "max_num_seqs": 8}, "workload.arrival.rate": 30.0},
    # contexts cut by max_model_len end runs too
    "max_model_len": {"policy": {**V1, "max_model_len": 160, "enable_prefix_caching": False}},
    "priority": {"policy": {**V1, "policy": "priority", "num_blocks": 400}},
    # a linear model: the engine adds up step times from coefficients
    "linear": {"policy": V1, "engine.latency": {"type": "linear", "base": 0.01,
                                                 "per_seq": 0.0002,
                                                 "per_prefill_token": 0.00005}},
}


def run_pair(overrides: dict, n: int) -> list[dict]:
    """The seed scenario with ``overrides`` per-step and with runs: what the recorder keeps
    (as tests/test_batch_runs.py compares it), the memory series and summary, and the block
    pool at the end (free queue order, prefix cache, evictions, hash count)."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variants[0]
    arrays = generate_workload(cfg)
    out = []
    for flag in (False, True):
        Engine.fast_paths = flag
        try:
            m = build_model(cfg, arrays)
            m.env.run()
        finally:
            Engine.fast_paths = True
        out.append(record(m))
    return out


def record(m) -> dict:
    """What a finished model recorded, for comparisons (see :func:`run_pair`)."""
    policy = m.engine.policy
    kv = policy.kv
    return {
        **snapshot(m), "kv": policy.pool.summary(),
        "blocks": ([b.block_id for b in kv.pool.free_queue],
                   {h: list(blocks) for h, blocks in kv.pool.cached.items()},
                   kv.pool.num_evictions, len(kv.hasher)),
    }


def assert_same(slow: dict, fast: dict) -> None:
    assert_identical(slow, fast)
    for name, col in slow["kv_series"].items():
        np.testing.assert_array_equal(col, fast["kv_series"][name], err_msg=name)
    assert slow["kv"] == fast["kv"]
    assert slow["blocks"] == fast["blocks"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_runs_equal_steps(name):
    slow, fast = run_pair({**BASE, **SCENARIOS[name]}, 400)
    assert_same(slow, fast)
    assert fast["events"] < slow["events"], "no run was taken"
    if SCENARIOS[name]["policy"].get("enable_prefix_caching", True):
        assert slow["blocks"][1]  # blocks were cached


def test_async_runs_stay_step_by_step():
    slow, fast = run_pair({**BASE, "policy": {**V1, "async_scheduling": True}}, 200)
    assert_same(slow, fast)


@pytest.mark.parametrize("name", ["fcfs", "sarathi", "priority-preempt", "srpt"])
def test_token_policies_run_under_roofline_as_steps_do(name):
    # roofline times a listed all-decode step as its aggregates, so these runs are exact too
    policy = {**TOKEN_POLICIES[name], "max_batch": 16}
    over = {**BASE, "policy": policy}
    if name == "priority-preempt":
        over["workload.classes"] = [{"name": "interactive", "weight": 1, "priority": 0},
                                    {"name": "batch", "weight": 2, "priority": 1}]
    slow, fast = run_both(over, n=400, variant=None)
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"]


def test_a_stop_inside_a_run_keeps_the_steps_that_ended():
    over = {**BASE, "policy": V1}
    slow, fast = run_both(over, n=300, variant=None, stop_at=7.0011)
    assert_identical(slow, fast)
    states = slow["columns"]["state"]
    assert (states == RequestState.ABORTED).any() and (states == RequestState.FINISHED).any()


def test_empty_steps_without_a_trace_are_steps_and_runs_still_equal():
    slow, fast = run_pair({**BASE, "policy": {**V1, "empty_steps": True},
                           "workload.arrival.rate": 1.0}, 60)
    assert_same(slow, fast)


CHAINS = {
    # few arrivals: most runs end at a finish with nobody waiting
    "sparse": {"policy": V1, "workload.arrival.rate": 2.0},
    "sparse_no_cache": {"policy": {**V1, "enable_prefix_caching": False},
                        "workload.arrival.rate": 3.0},
    # few blocks: a chain stops where its crossings would not fit
    "tight": {"policy": {**V1, "num_blocks": 160, "block_size": 8},
              "workload.arrival.rate": 3.0},
    "max_model_len": {"policy": {**V1, "max_model_len": 160}, "workload.arrival.rate": 3.0},
    "linear": {**SCENARIOS["linear"], "workload.arrival.rate": 2.0},
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_runs_chained_after_finishes_equal_steps(name, monkeypatch):
    # the runs that follow a run's finishes while nobody waits are one engine run
    from orcasim.policies.vllm_v1 import VllmV1

    chained = []
    complete = VllmV1._complete_chain

    def counted(self, *args):
        chained.append(args[2:])
        return complete(self, *args)

    monkeypatch.setattr(VllmV1, "_complete_chain", counted)
    slow, fast = run_pair({**BASE, **CHAINS[name]}, 300)
    assert_same(slow, fast)
    assert chained, "no run was chained"
