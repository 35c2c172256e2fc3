"""Runs of unchanged-batch steps in one event give exactly the per-step results.

The engine advances a decode-only batch that cannot change (nobody finishes,
no arrival could join) in one event, and the source releases arrivals lazily
into a backlog; every test here runs the same model both ways
(``Engine.fast_paths``) and compares everything the run records.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

import orcasim
from orcasim.engine import Engine, Until
from orcasim.simulation import build_model, generate_workload


def run_both(overrides: dict, n: int = 1500, variant: str = "continuous", stop_at=None):
    """The seed scenario with ``overrides``, run with and without runs: (per-step, runs)."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variants[0] if variant is None else sc.variant(variant)
    arrays = generate_workload(cfg)
    out = []
    for flag in (False, True):
        Engine.fast_paths = flag
        try:
            m = build_model(cfg, arrays)
            if stop_at is not None:
                def stopper(env=m.env, engine=m.engine):
                    yield env.timeout(stop_at)
                    engine.stop("test_stop")
                m.env.process(stopper())
            m.env.run()
        finally:
            Engine.fast_paths = True
        rec = m.recorder
        out.append({
            "columns": rec.request_columns(),
            "itl": rec.itl_samples(),
            "itl_times": rec.itl_times(),
            "series": rec.series_rows(),
            "num_steps": rec.num_steps,
            "sum_batch": rec.sum_batch,
            "busy": m.engine.busy_time,
            "now": m.env.now,
            "events": next(m.env._eid),
            "kv_series": rec.kv.rows() if rec.kv is not None else None,
            "kv": m.ctx.kv.summary(),
            "preemptions": m.ctx.preemption_summary(),
        })
    return out


def assert_identical(slow: dict, fast: dict) -> None:
    for key in ("num_steps", "sum_batch", "busy", "now"):
        assert slow[key] == fast[key], key
    for name, col in slow["columns"].items():
        if isinstance(col, np.ndarray):
            np.testing.assert_array_equal(col, fast["columns"][name], err_msg=name)
        else:
            assert col == fast["columns"][name], name
    for a, b in zip(slow["itl"], fast["itl"], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(slow["itl_times"], fast["itl_times"])
    for name, col in slow["series"].items():
        np.testing.assert_array_equal(col, fast["series"][name], err_msg=name)
    assert (slow["kv_series"] is None) == (fast["kv_series"] is None)
    for name, col in (slow["kv_series"] or {}).items():
        np.testing.assert_array_equal(col, fast["kv_series"][name], err_msg=f"kv {name}")
    np.testing.assert_equal(slow["kv"], fast["kv"])
    assert slow["preemptions"] == fast["preemptions"]


SCENARIOS = {
    # the seed workload: overloaded, the batch always full; runs end at finishes
    "seed": {},
    # light load: the batch has room, so runs end at arrivals; idle gaps between
    "light": {"workload.arrival.rate": 1.5, "policy.max_batch": 4},
    "prefill": {"policy.prefill": True, "engine.latency.per_prefill_token": 0.0001},
    "constant_latency": {"engine.latency": {"type": "constant", "step_time": 0.05},
                         "workload.arrival.rate": 8.0},
    # KV memory: runs end before a boundary whose growth the free blocks may not cover, and
    # while the queue's head waits for memory the batch runs on; preemptions put requests back
    "kv_limited": {"memory": {"block_size": 16, "num_blocks": 400}},
    "kv_ample": {"memory": {"block_size": 16, "num_blocks": 100_000}},
    "kv_light": {"memory": {"block_size": 8, "num_blocks": 600},
                 "workload.arrival.rate": 1.5, "policy.max_batch": 8},
    "kv_prefill": {"memory": {"block_size": 16, "num_blocks": 400}, "policy.prefill": True,
                   "engine.latency.per_prefill_token": 0.0001},
    "kv_watermark": {"memory": {"block_size": 16, "num_blocks": 400}, "policy.watermark": 0.05,
                     "policy.victim": "lowest_priority"},
    "kv_swap": {"memory": {"block_size": 16, "num_blocks": 300, "bytes_per_token": 1000,
                           "swap_space_gb": 0.002, "pcie_bandwidth": 1e9},
                "policy.preemption": "swap"},
    # reservations: nothing grows during a run, refusals repeat until someone leaves
    "kv_oracle": {"memory": {"allocator": "oracle", "block_size": 16, "num_blocks": 400}},
    "kv_pow2_buddy": {"memory": {"allocator": "pow2", "placement": "buddy", "block_size": 16,
                                 "num_blocks": 512}},
    "kv_limited_skip": {"memory": {"block_size": 16, "num_blocks": 300},
                        "policy.kv_admission": "skip", "workload.num_requests": 300},
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_runs_equal_per_step_simulation(name):
    slow, fast = run_both(SCENARIOS[name])
    assert_identical(slow, fast)
    # runs took the place of steps, the backlog that of arrival events
    assert fast["events"] < slow["events"] * (0.9 if name == "kv_limited_skip" else 0.7)
    if name in ("kv_limited", "kv_swap"):
        assert fast["preemptions"]["num_preemptions"] > 50  # the memory binds


@pytest.mark.parametrize("memory", [{"block_size": 16, "num_blocks": 400},
                                    {"block_size": 16, "num_blocks": 100_000}])
def test_static_batches_with_memory_run_in_one_event_per_finish(memory):
    slow, fast = run_both({"memory": memory}, n=400, variant="static")
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"] * 0.7


def test_static_batches_run_in_one_event_per_finish():
    slow, fast = run_both({}, n=600, variant="static")
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"] * 0.7


def test_a_stop_inside_a_run_keeps_the_steps_that_ended(monkeypatch):
    cuts = []
    cut = Engine._cut_run

    def spy(self, t0):
        cuts.append(len(self._run[4]))
        return cut(self, t0)

    monkeypatch.setattr(Engine, "_cut_run", spy)
    slow, fast = run_both({}, n=300, stop_at=5.001)
    assert cuts and cuts[0] > 1  # the stop came inside a run of several steps
    assert_identical(slow, fast)
    cols = fast["columns"]
    assert set(cols["reason"]) == {None, "test_stop", "stopped"}


def test_until_fires_at_a_time_no_delay_reaches():
    env = simpy.Environment(initial_time=0.022664396798963652)
    at = 0.06220439679896366
    d = at - env.now
    assert env.now + d != at  # the sum rounds away: a plain timeout could not land here
    seen = []

    def proc():
        yield Until(env, at)
        seen.append(env.now)

    env.process(proc())
    env.run()
    assert seen == [at]
    with pytest.raises(ValueError, match="in the past"):
        Until(env, 0.0)


TOKEN_POLICIES = {
    "fcfs": {"type": "fcfs"},
    "sarathi": {"type": "sarathi", "token_budget": 256},
    "prefill-first": {"type": "prefill-first"},
    "decode-first": {"type": "decode-first", "refill_below": 4},
    "priority-preempt": {"type": "priority", "preempt": True},
    "srpt": {"type": "srpt", "sigma": 0.5},
    "sjf": {"type": "sjf"},
    "edf": {"type": "edf", "default_deadline": 30.0},
    "vtc": {"type": "vtc"},
}


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", TOKEN_POLICIES)
def test_token_policy_runs_equal_per_step_simulation(name, rate):
    policy = {**TOKEN_POLICIES[name], "max_batch": 16}
    over = {"policy": policy, "variants": None, "workload.arrival.rate": rate,
            "engine.latency.per_prefill_token": 0.0001}
    if name in ("priority-preempt", "vtc"):
        over["workload.classes"] = [{"name": "interactive", "weight": 1, "priority": 0},
                                    {"name": "batch", "weight": 2, "priority": 1}]
    slow, fast = run_both(over, n=600, variant=None)
    assert_identical(slow, fast)
    if name != "vtc":  # fair-share policies charge every step: no runs
        assert fast["events"] < slow["events"] * 0.8


def test_kv_series_in_runs_equals_step_by_step():
    """Rows added as runs of any length bin exactly as the same rows added one by one,
    across flushes that cut a run in two."""
    from orcasim.metrics.kv_series import _BUFFER, KVSeries

    rng = np.random.default_rng(3)
    one, runs = KVSeries(capacity=64, total=10_000), KVSeries(capacity=64, total=10_000)
    t, tokens, steps = 0.0, 100, 0
    while steps < 3 * _BUFFER + 77:
        k = int(rng.integers(1, 40))
        size, padding, swapped = int(rng.integers(0, 33)), int(rng.integers(0, 9)), steps % 5
        blocked = bool(rng.integers(0, 2))
        ends = list(t + np.cumsum(rng.uniform(0.001, 0.01, k)))
        alloc = [int(a) for a in rng.integers(0, 10_000, k)]
        internal = [int(a) for a in rng.integers(0, 50, k)]
        runs.add_run(t, ends, tokens, size, alloc, internal, padding, swapped, blocked)
        start = t
        for i in range(k):
            one.add(start, ends[i], tokens + size * i, alloc[i], internal[i], padding, swapped,
                    blocked)
            start = ends[i]
        t, tokens, steps = ends[-1], tokens + size * k + 3, steps + k
    assert len(runs) < _BUFFER  # whole blocks were binned on the way
    a, b = one.rows(), runs.rows()
    assert a["num_steps"].sum() == steps
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert one.totals() == runs.totals()


def test_the_clock_skips_only_past_nothing():
    """With nothing else scheduled the engine moves the clock itself (no events at all); a
    process with timers makes it wait for each, and sees the same state either way."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": 400})
    cfg = sc.variant("continuous")
    arrays = generate_workload(cfg)

    def model(watch: bool):
        m = build_model(cfg, arrays)
        seen = []
        if watch:
            def watcher(env=m.env, ctx=m.ctx):
                while True:
                    yield env.timeout(0.37)
                    if ctx.recorder.num_recorded == len(arrays):  # every request ended
                        return
                    # what a process sees: the clock and who has started (inside a run the
                    # recorded steps lag until its end, as without skipping the clock)
                    seen.append((env.now, ctx.num_started))
            m.env.process(watcher())
        m.env.run()
        return m, seen

    plain, _ = model(False)
    assert next(plain.env._eid) < 10  # the engine, the source and the start: no step events
    watched, seen = model(True)
    Engine.fast_paths = False
    try:
        slow, seen_slow = model(True)
    finally:
        Engine.fast_paths = True
    assert len(seen) > 100 and seen == seen_slow
    for m in (watched, slow):
        for name, col in plain.recorder.request_columns().items():
            other = m.recorder.request_columns()[name]
            if isinstance(col, np.ndarray):
                np.testing.assert_array_equal(col, other, err_msg=name)
        assert m.recorder.num_steps == plain.recorder.num_steps
        assert m.engine.busy_time == plain.engine.busy_time
