"""Runs of unchanged-batch steps in one event give exactly the per-step results.

The engine advances a decode-only batch that cannot change (nobody finishes,
no arrival could join) in one event, and the source releases arrivals lazily
into a backlog; every test here runs the same model both ways
(``Engine.fast_paths``) and compares everything the run records.
"""

from __future__ import annotations

import bisect

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
            ended = spy_ended(m)
            watch_and_stop(m, len(arrays), None, stop_at)
            m.env.run()
        finally:
            Engine.fast_paths = True
        out.append({**snapshot(m), "ended": ended})
    return out


def spy_ended(m) -> list[int]:
    """The ids of ``m``'s requests in the order they end, filled as the model runs (the
    recorder keeps its rows by id)."""
    ended: list[int] = []
    record = m.recorder.record_request

    def spy(req, record=record, ended=ended):
        ended.append(req.id)
        record(req)

    m.recorder.record_request = spy
    return ended


def watch_and_stop(m, until: int, watch: float | None, stop_at: float | None,
                   probe=None) -> list:
    """Processes that make a model's fast paths hand boundaries back to the engine: every
    ``watch`` seconds, until ``until`` requests are recorded, a watcher notes ``(now,
    started, slots taken, probe(ctx))``; at ``stop_at`` a hard stop. Returns the notes."""
    seen: list = []
    if watch is not None:
        def watcher(env=m.env, ctx=m.ctx):
            while ctx.recorder.num_recorded < until:
                yield env.timeout(watch)
                seen.append((env.now, ctx.num_started, ctx.slots.count,
                             probe(ctx) if probe is not None else None))
        m.env.process(watcher())
    if stop_at is not None:
        def stopper(env=m.env, engine=m.engine):
            yield env.timeout(stop_at)
            engine.stop("test_stop")
        m.env.process(stopper())
    return seen


def running_ids(ctx) -> list[int]:
    """The running requests' ids, sorted (a watcher's probe)."""
    return sorted(r.id for r in ctx.running)


def snapshot(m) -> dict:
    """What a finished model recorded, for comparing two ways of simulating it
    (:func:`assert_identical`)."""
    rec = m.recorder
    return {
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
        "counters": dict(getattr(m.engine.policy, "counters", {})),
    }


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
    assert slow.get("counters") == fast.get("counters")  # fair-share counters, bit for bit
    assert slow.get("ended") == fast.get("ended")  # the order requests end in


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
    "sarathi-tiny-budget": {"type": "sarathi", "token_budget": 12},
    "prefill-first": {"type": "prefill-first"},
    "decode-first": {"type": "decode-first", "refill_below": 4},
    "priority-preempt": {"type": "priority", "preempt": True},
    "priority-classes": {"type": "priority", "preempt": True,
                         "classes": {"interactive": 0, "batch": 1, "rare": 2}},
    "priority-aging": {"type": "priority", "preempt": True, "aging_s": 0.5,
                       "classes": {"interactive": 0, "batch": 1, "rare": 2}},
    "srpt": {"type": "srpt", "sigma": 0.5},
    "srpt-true-lengths": {"type": "srpt"},
    "sjf": {"type": "sjf"},
    "sjf-noisy": {"type": "sjf", "sigma": 0.5},
    "edf": {"type": "edf", "default_deadline": 30.0},
    "vtc": {"type": "vtc"},
    "class-share": {"type": "class-share", "weights": {"interactive": 3.0}},
}


@pytest.mark.parametrize("rate", [30.0, 2.0])
@pytest.mark.parametrize("name", TOKEN_POLICIES)
def test_token_policy_runs_equal_per_step_simulation(name, rate):
    policy = {**TOKEN_POLICIES[name], "max_batch": 16}
    over = {"policy": policy, "variants": None, "workload.arrival.rate": rate,
            "engine.latency.per_prefill_token": 0.0001}
    if name in ("priority-preempt", "priority-classes", "priority-aging", "vtc", "class-share"):
        over["workload.classes"] = [
            {"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
            {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"},
            {"name": "rare", "weight": 0.2, "priority": 1, "tenant": "c"}]
    slow, fast = run_both(over, n=600, variant=None)
    assert_identical(slow, fast)
    assert fast["events"] < slow["events"] * (0.95 if name == "sarathi-tiny-budget" else 0.8)
    if name in ("vtc", "class-share"):
        assert len(fast["counters"]) == 3


def test_fair_share_runs_replay_lifts_between_their_steps(monkeypatch):
    """An arrival that finds its tenant idle mid-run reads counters charged up to then."""
    from orcasim.policies.fair import FairSharePolicy
    splits = []
    settle = FairSharePolicy._settle

    def spy(self, starts, k):
        splits.extend((bisect.bisect_left(starts, t, 0, k), k) for t, _, _ in self._lifts)
        return settle(self, starts, k)

    monkeypatch.setattr(FairSharePolicy, "_settle", spy)
    over = {"policy": {"type": "vtc", "max_batch": 16, "weights": {"b": 3.0}}, "variants": None,
            "workload.arrival.rate": 4.0, "engine.latency.per_prefill_token": 0.0001,
            "workload.classes": [{"name": "x", "weight": 1, "tenant": "a"},
                                 {"name": "y", "weight": 1, "tenant": "b"},
                                 {"name": "z", "weight": 1, "tenant": "c"}]}
    slow, fast = run_both(over, n=400, variant=None)
    assert_identical(slow, fast)
    # some lifts came after some of their run's steps had started, and before others
    assert any(0 < i < n for i, n in splits)
    assert fast["counters"]["b"] != round(fast["counters"]["b"])  # weight 3: inexact charges


@pytest.mark.parametrize(("x", "c", "n"), [(0.0, 2.0, 7), (12.0, 0.5, 1000), (1.0, 2 / 3, 50),
                                          (3e8, 2.0, 9), (0.1, 0.2, 33), (5.0, 0.0, 4)])
def test_add_repeated_equals_adding_one_at_a_time(x, c, n):
    from orcasim.policies.fair import add_repeated
    y = x
    for _ in range(n):
        y += c
    assert add_repeated(x, c, n) == y


@pytest.mark.parametrize(("x", "c", "n"), [(0.0, 2.0, 7), (12.0, 0.5, 1000), (1.0, 2 / 3, 50),
                                          (3e8, 2.0, 9), (0.1, 0.2, 33), (5.0, 0.0, 4),
                                          (7.0, 2 / 3, 1), (2.0**27, 2.0, 2**20),
                                          (2.0**28 - 8.0, 2.0, 5)])
def test_fair_charges_equal_add_repeated(x, c, n):
    """``FairSharePolicy._charge`` adds ``add_repeated``'s exact case in place: the same
    counters as ``add_repeated`` (and as adding one token at a time)."""
    from types import SimpleNamespace

    from orcasim.policies.fair import FairSharePolicy, add_repeated
    for m, steps in ((1, n), (n, 1)):
        owner = SimpleNamespace(_counters={"g": x}, _token_cost={"g": c},
                                _queue=SimpleNamespace(_chosen=["g"]))
        FairSharePolicy._charge(owner, {"g": m}, steps)  # type: ignore[arg-type]
        assert owner._counters["g"] == add_repeated(x, c, n)
        assert owner._queue._chosen == []


@pytest.mark.parametrize("name", ["fcfs", "sarathi", "srpt", "decode-first"])
def test_token_plans_after_runs_equal_the_plain_plan(monkeypatch, name):
    """The plans built from what a run noted (decodes, KV tokens, steps left) equal the plain
    ``TokenPolicy.make_plan`` of the same requests, and ``steps_left`` its plain pass."""
    from orcasim.policies.base import TokenPolicy
    from orcasim.policies.common import BatchPolicy
    from orcasim.policies.runs import TokenRuns
    fields = ("num_seqs", "num_kv_tokens", "num_prefill_tokens", "num_decode_tokens", "contexts")
    make_plan = BatchPolicy.make_plan
    hinted = []

    def checked(self, scheduled):
        hinted.append(self._decodes is not None and self._decodes[0] is scheduled)
        plan = make_plan(self, scheduled)
        if self.pool is not None:
            self.pool.sync()  # the plain plan reads every request's counters
        plain = TokenPolicy.make_plan(self, scheduled)
        assert [getattr(plan, f) for f in fields] == [getattr(plain, f) for f in fields]
        assert self.steps_left(plan) == TokenRuns.steps_left(self, plan)
        return plan

    monkeypatch.setattr(BatchPolicy, "make_plan", checked)
    over = {"policy": {**TOKEN_POLICIES[name], "max_batch": 16}, "variants": None,
            "engine.latency.per_prefill_token": 0.0001}
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    assert sum(hinted) > 50  # most plans after a run start from its notes


def test_a_runs_last_step_finishes_requests_in_that_steps_order():
    """srpt orders by predicted remaining length. y runs alone first; x joins at the second
    step, which is scheduled as the running requests' order (y) and then the admissions (x),
    and starts a run to the end. Both finish in its last step, whose order is by remaining
    length: x (predicted 1.8 tokens, past its prediction: 0 left) before y (29.1 predicted,
    17.1 left). The run's finish order is the last step's, as step by step."""
    reqs = [{"name": "y", "arrival": 0.0, "prompt_len": 8, "output_len": 13},
            {"name": "x", "arrival": 0.001, "prompt_len": 8, "output_len": 12}]
    over = {"seed": 0, "policy": {"type": "srpt", "sigma": 1.0, "max_batch": 4},
            "variants": None, "workload": {"type": "list", "requests": reqs}}
    slow, fast = run_both(over, n=2, variant=None)
    assert_identical(slow, fast)
    assert fast["num_steps"] == 13 and fast["events"] < slow["events"] - 10  # a run of 12
    assert fast["ended"] == [1, 0]  # x, then y


def test_no_run_when_a_plan_spends_the_budget_before_a_preemptive_policy_looks_at_the_queue():
    """Step 2 decodes a and admits b, whose prompt takes the rest of the budget, so the queue's
    head d is not looked at; step 3 has budget left and preempts a (level 2) for d (level 1).
    A run from step 2 would have skipped that preemption."""
    reqs = [{"name": "a", "arrival": 0.0, "prompt_len": 4, "output_len": 50, "priority": 2},
            {"name": "b", "arrival": 0.001, "prompt_len": 15, "output_len": 50, "priority": 0},
            {"name": "d", "arrival": 0.002, "prompt_len": 4, "output_len": 5, "priority": 1}]
    over = {"policy": {"type": "priority", "preempt": True, "max_batch": 2, "token_budget": 16},
            "variants": None, "workload": {"type": "list", "requests": reqs}}
    slow, fast = run_both(over, n=3, variant=None)
    assert_identical(slow, fast)
    assert fast["preemptions"]["num_preemptions_priority"] == 1
    assert fast["events"] < slow["events"]


TIES = [{"arrival": 0.02 * (i // 5), "prompt_len": 5 + i % 7, "output_len": 3 + (7 * i) % 11,
         "priority": (i // 2) % 2} for i in range(60)]  # keys tie: five arrive at once


@pytest.mark.parametrize("name", ["priority-preempt", "priority-aging", "edf", "sjf", "ties"])
def test_keyed_running_order_kept_as_requests_come_and_go_is_the_sorted_order(monkeypatch, name):
    """With static keys the running requests are kept in key order as they are admitted and
    leave; at every use it equals sorting them, and its last is the largest key (the latest
    admitted among ties)."""
    from orcasim.policies.keyed import KeyedPolicy
    order, worst = KeyedPolicy.order, KeyedPolicy.memory_victim
    seen = []

    def checked_order(self, reqs):
        got = list(order(self, reqs))
        assert got == sorted(reqs, key=self.key)
        seen.append(self._ordered is not None and reqs is self.running)
        return got

    def checked_worst(self):
        got = worst(self)
        assert got is max(reversed(self.running), key=self.key)
        return got

    monkeypatch.setattr(KeyedPolicy, "order", checked_order)
    monkeypatch.setattr(KeyedPolicy, "memory_victim", checked_worst)
    if name == "ties":
        over = {"policy": {"type": "priority", "preempt": True, "max_batch": 4},
                "variants": None, "workload": {"type": "list", "requests": TIES}}
    else:
        over = {"policy": {**TOKEN_POLICIES[name], "max_batch": 8}, "variants": None,
                "workload.arrival.rate": 20.0, "engine.latency.per_prefill_token": 0.0001,
                "workload.classes": [
                    {"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
                    {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"},
                    {"name": "rare", "weight": 0.2, "priority": 1, "tenant": "c"}]}
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    assert sum(seen) > (30 if name == "ties" else 100)
    if name.startswith("priority"):
        assert fast["preemptions"]["num_preemptions_priority"] > (5 if name.endswith("t") else 0)


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
