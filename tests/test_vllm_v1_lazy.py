"""vllm-v1's decode group (lazy decode path) gives exactly the per-request schedule.

Each scenario runs with the decode group off (every running request scheduled
one by one, step by step: the reference), with it on step by step, and with it
on in runs of steps, and compares everything the run records, the memory
series and the block pool at the end (free queue order, prefix cache).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simpy

import orcasim
from orcasim.context import SchedulerContext
from orcasim.engine import Engine
from orcasim.latency.linear import ConstantLatency
from orcasim.metrics.recorder import Recorder
from orcasim.policies.vllm_v1 import VllmV1
from orcasim.policies.vllm_v1.group import DecodeGroup
from orcasim.request import Request, RequestState
from orcasim.simulation import build_model, generate_workload
from orcasim.source import OpenLoopSource
from orcasim.steptrace import StepWorkload, load_workload
from tests.test_batch_runs import assert_identical, run_both
from tests.test_vllm_v1_runs import BASE, SCENARIOS, V1, assert_same, record


def run_three(overrides: dict, n: int) -> tuple[list[dict], list[int]]:
    """Eager step by step (the reference), lazy step by step, lazy in runs; and the decode
    group's count at the end of the lazy ones (group steps taken)."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variants[0]
    arrays = generate_workload(cfg)
    results, counts = [], []
    for lazy, fast in ((False, False), (True, False), (True, True)):
        VllmV1.lazy_decode = lazy
        Engine.fast_paths = fast
        try:
            m = build_model(cfg, arrays)
            m.env.run()
        finally:
            VllmV1.lazy_decode = True
            Engine.fast_paths = True
        results.append(record(m))
        if lazy:
            counts.append(m.engine.policy._group.count)
    return results, counts


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_lazy_decode_equals_eager(name):
    (eager, lazy_steps, lazy_runs), counts = run_three({**BASE, **SCENARIOS[name]}, 300)
    assert_same(eager, lazy_steps)
    assert_same(eager, lazy_runs)
    assert all(c > 100 for c in counts), f"the decode group hardly stepped: {counts}"


@pytest.mark.parametrize("policy", [
    {"num_blocks": 120, "block_size": 4, "long_prefill_token_threshold": 64},
    # one-token blocks: every member takes a block and caches one in every step
    {"num_blocks": 1500, "block_size": 1, "policy": "priority"},
], ids=["bs4", "bs1-priority"])
def test_lazy_decode_equals_eager_under_pressure_with_small_blocks(policy):
    over = {**BASE, "policy": {**V1, **policy}, "workload.arrival.rate": 30.0}
    (eager, lazy_steps, lazy_runs), _ = run_three(over, 200)
    assert eager["preemptions"]["num_preemptions"] > 0, "no preemption: the fallback is untested"
    assert_same(eager, lazy_steps)
    assert_same(eager, lazy_runs)


def test_clients_giving_up_mid_step_cancel_members_as_the_eager_schedule_does():
    # a client's timeout cancels a running request while a step the group scheduled is in
    # flight: the members' counters are written back and that step's output is applied
    # request by request
    over = {**BASE, "policy": V1, "clients": {"timeout": 1.5}}
    (eager, lazy_steps, lazy_runs), counts = run_three(over, 200)
    states = eager["columns"]["state"]
    assert (states == RequestState.ABORTED).any() and (states == RequestState.FINISHED).any()
    assert_same(eager, lazy_steps)
    assert_same(eager, lazy_runs)
    assert all(c > 100 for c in counts)


def test_a_stop_inside_lazy_decoding_aborts_with_counters_written_back():
    over = {**BASE, "policy": V1}
    VllmV1.lazy_decode = False
    try:
        eager, _ = run_both(over, n=300, variant=None, stop_at=7.0011)
    finally:
        VllmV1.lazy_decode = True
    slow, fast = run_both(over, n=300, variant=None, stop_at=7.0011)
    assert_identical(eager, slow)
    assert_identical(eager, fast)


def test_decode_group_buckets_members_by_block_phase_and_pops_finishers_in_order():
    class S:
        base = 0

    g = DecodeGroup(4)
    reqs = [Request(i, 0.0, 5, out) for i, out in enumerate((3, 10, 4))]
    seqs = [S() for _ in reqs]
    for req, seq, c in zip(reqs, seqs, (5, 8, 6), strict=True):
        req.num_output_tokens = 1
        g.join(req, seq, c, 100)
    assert [s.base for s in seqs] == [5, 8, 6]
    assert g.total == sum(g.bases) == 19  # kept as members come and go
    assert g.at(0) == [reqs[1]]  # 8 computed: its next slot starts a block
    assert g.at(2) == [reqs[2]]  # 6 + 2
    assert g.first_last() == 2  # reqs 0 and 2: their last outputs come after 2 more tokens
    g.count = 2
    assert g.pop_finished() == [reqs[0], reqs[2]]
    assert g.members == [reqs[1]] and g.bases == [8] and g.total == 8
    assert sum(map(len, g.buckets)) == 1


def test_boundary_blocks_are_the_buckets_of_each_step_with_the_slots_after_each():
    rng = np.random.default_rng(5)
    for _ in range(500):
        bs = int(rng.choice([1, 2, 4, 16]))
        g = DecodeGroup(bs)
        g.buckets = [[object() for _ in range(int(rng.integers(0, 4)))] for _ in range(bs)]
        start = int(rng.integers(0, 50))
        stop = start + int(rng.integers(0, 40))
        alloc = int(rng.integers(0, 1000))
        allocs = [7]
        new = g.boundary_blocks(start, stop, alloc, allocs)
        want, want_allocs = [], [7]  # step by step
        for j in range(start, stop):
            want += g.buckets[-j % bs]
            alloc += bs * len(g.buckets[-j % bs])
            want_allocs.append(alloc)
        assert new == want and allocs == want_allocs


GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"


def run_step_clock(workload: StepWorkload, lazy: bool, fast: bool) -> tuple[dict, int]:
    """A golden workload on the step clock without a trace observer: the request columns
    and the block pool at the end, and the decode group's count."""
    VllmV1.lazy_decode = lazy
    Engine.fast_paths = fast
    try:
        env = simpy.Environment()
        rec = Recorder()
        ctx = SchedulerContext(env, rec)
        policy = VllmV1(workload.params, ctx)
        OpenLoopSource(env, ctx, workload.arrays())
        Engine(env, ctx, policy, ConstantLatency(ConstantLatency.Params(step_time=1.0)))
        env.run()
    finally:
        VllmV1.lazy_decode = True
        Engine.fast_paths = True
    pool = policy.kv.pool
    return ({"columns": rec.request_columns(), "itl": rec.itl_samples(),
             "steps": rec.num_steps, "kv": rec.kv.rows(),
             "free": [b.block_id for b in pool.free_queue],
             "cached": {h: list(b) for h, b in pool.cached.items()},
             "evictions": pool.num_evictions}, policy._group.count)


def test_golden_workloads_without_a_trace_decode_lazily_as_step_by_step():
    # the golden workloads (prefix sharing, pressure, priority, thresholds) with the decode
    # group: the same requests, memory rows and block pool as the per-request schedule
    workloads = {p.stem: load_workload(p) for p in sorted(GOLDEN.glob("*.json"))}
    workloads = {k: w for k, w in workloads.items() if not w.params.async_scheduling}
    stepped = 0
    for stem, workload in workloads.items():
        eager, _ = run_step_clock(workload, False, False)
        for fast in (False, True):
            lazy, count = run_step_clock(workload, True, fast)
            where = f"{stem} (runs: {fast})"
            for name, col in eager["columns"].items():
                np.testing.assert_array_equal(col, lazy["columns"][name],
                                              err_msg=f"{where}: {name}")
            for a, b in zip(eager["itl"], lazy["itl"], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=where)
            for name, col in eager["kv"].items():
                np.testing.assert_array_equal(col, lazy["kv"][name], err_msg=f"{where}: {name}")
            assert (eager["steps"], eager["free"], eager["cached"], eager["evictions"]) == (
                lazy["steps"], lazy["free"], lazy["cached"], lazy["evictions"]), where
        stepped += count > 0
    assert len(workloads) >= 25 and stepped == len(workloads), (stepped, len(workloads))



def test_steps_of_the_group_alone_are_planned_by_their_sizes_with_roofline():
    # roofline times an all-decode step from its sizes: the group's steps leave out the list
    # of requests, with the same results as plans that list them (the eager schedule above
    # lists every step's requests, and this compares with the group's plans listed too)
    sc = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": 200, **BASE, "policy": {**V1, "enable_prefix_caching": False}})
    cfg = sc.variants[0]
    arrays = generate_workload(cfg)
    results, listed = [], []
    for by_sizes in (False, True):
        m = build_model(cfg, arrays)
        assert m.engine.policy.plans_by_aggregates  # roofline says all-decode sums suffice
        m.engine.policy.plans_by_aggregates = by_sizes
        m.engine.policy.chain_runs = False  # each group-alone run's first step is timed here
        step_time = m.engine.latency.step_time
        plans = []

        def timed(plan, step_time=step_time, plans=plans):
            plans.append(plan.scheduled is not None)
            return step_time(plan)

        m.engine.latency.step_time = timed
        m.env.run()
        results.append(record(m))
        listed.append(plans)
    assert_same(*results)
    assert all(listed[0]) and 0 < listed[1].count(False) < len(listed[1])
    # the step table lists the group's members of a step planned by its sizes
    steps = []
    for by_sizes in (False, True):
        m = build_model(cfg, arrays, trace_steps=True)
        m.engine.policy.plans_by_aggregates = by_sizes
        m.env.run()
        steps.append(m.recorder.steps)
    assert steps[0] == steps[1] and len(steps[0]) > 1000
    # the group's steps with one prompt admitted from its start are planned by sizes too
    m = build_model(cfg, arrays)
    mixed = []
    step_time = m.engine.latency.step_time

    def counted(plan, step_time=step_time, mixed=mixed, policy=m.engine.policy):
        if plan.scheduled is None and policy._current.entries:
            mixed.append(plan.num_prefill_tokens)
        return step_time(plan)

    m.engine.latency.step_time = counted
    m.env.run()
    assert len(mixed) > 50 and min(mixed) > 1
    # a latency model that reads the listed requests always gets them
    over = {"workload.num_requests": 20, **BASE, "policy": V1,
            "engine.latency": {"type": "constant", "step_time": 0.01}}
    cfg = orcasim.load_scenario("seed_orca").override(over).variants[0]
    assert not build_model(cfg, generate_workload(cfg)).engine.policy.plans_by_aggregates


def test_a_lazy_backlog_reversed_is_its_queue_backwards():
    # the policy takes its new arrivals from the right end of the lazy source's backlog
    env = simpy.Environment()
    ctx = SchedulerContext(env, Recorder())
    workload = load_workload(GOLDEN / "burst.json")
    src = OpenLoopSource(env, ctx, workload.arrays())
    src.release_lazily()
    backlog = ctx.waiting
    src.flush(float("inf"))
    first = backlog.popleft()
    backlog.appendleft(first)  # put back in front of the released range, not yet requests
    assert [r.id for r in reversed(backlog)] == [r.id for r in backlog][::-1]
    assert len(list(reversed(backlog))) == len(backlog) == len(workload.requests)
