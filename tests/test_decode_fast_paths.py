"""The shortcuts of decode-only runs against the long way round.

A roofline model's decode step as a function of the KV tokens against its
``step_time``; the engine's runs with it against step-by-step simulation;
finishing requests together against one by one; the linear count of
distinct ids against ``np.unique``; a summary without group keys against
the group pass; and a step series that merges only its newest rows against
one that rebins all.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

import orcasim
from orcasim.context import SchedulerContext
from orcasim.latency.roofline import RooflineLatency
from orcasim.metrics import summary as summary_mod
from orcasim.metrics.recorder import Recorder
from orcasim.metrics.request_rows import distinct_count
from orcasim.metrics.series import BinnedSeries, rebin
from orcasim.plan import StepPlan
from orcasim.registry import latency_models
from orcasim.request import Request, RequestState
from orcasim.spec import build_spec
from tests.test_batch_runs import assert_identical, run_both


def roofline(**kw) -> RooflineLatency:
    return build_spec(latency_models, {"type": "roofline", **kw}, "engine.latency").create()


@pytest.mark.parametrize("kw", [
    {},
    {"model": "llama-2-7b", "gpu": "a100-80gb"},
    {"model": "llama-2-7b", "gpu": "a100-80gb", "tp": 2},  # all-reduce time on top
    {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 2},  # MoE: weights read by batch size
    {"compute_efficiency": 0.001},  # compute-bound: the other side of the max
])
def test_roofline_decode_step_is_step_time_bit_for_bit(kw):
    m = roofline(**kw)
    rng = np.random.default_rng(7)
    for size in (1, 2, 7, 32, 256):
        step = m.decode_step(size)
        assert step is not None
        for kv in [0, 1, size, 10**6, *rng.integers(0, 3_000_000, 50).tolist()]:
            assert step(kv) == m.step_time(StepPlan(size, kv)), (size, kv)


@pytest.mark.parametrize("kw", [
    {"model": "llama-2-7b", "gpu": "a100-80gb"},
    {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 2},
    {"compute_efficiency": 0.001},
    {"compute_efficiency": 0.01},  # compute-bound at short contexts, memory-bound at long ones
])
def test_roofline_decode_ends_is_the_loop_over_decode_step(kw):
    """A run timed at once: the ends and busy time of the engine's loop over decode_step
    (each step's end appended, stopping at the first end at or after the limit)."""
    m = roofline(**kw)
    rng = np.random.default_rng(11)
    assert m.decode_ends(0) is None
    for size in (1, 3, 32, 256):
        step, ends_of = m.decode_step(size), m.decode_ends(size)
        assert step is not None and ends_of is not None
        for _ in range(20):
            t0, busy0 = float(rng.uniform(0, 100)), float(rng.uniform(0, 50))
            kv, steps = int(rng.integers(0, 2_000_000)), int(rng.integers(0, 40))
            limit = float("inf") if rng.integers(2) else t0 + float(rng.uniform(0, 0.5))
            want, t, busy, x = [t0], t0, busy0, kv
            for _ in range(steps):
                d = step(x)
                t += d
                busy += d
                want.append(t)
                if t >= limit:
                    break
                x += size
            got = [t0]
            assert ends_of(t0, busy0, kv, steps, limit, got) == (t, busy)
            assert got == want


@pytest.mark.parametrize("kw", [
    {"model": "llama-2-7b", "gpu": "a100-80gb"},
    {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 2},
    {"compute_efficiency": 0.001},
])
def test_roofline_times_decodes_and_one_prompt_from_their_sizes_bit_for_bit(kw):
    """prefill_by_aggregates: one-token decodes and one more sequence that computes one
    token or a prompt from an empty context take as long as the plan of their sizes."""
    m = roofline(**kw)
    assert m.prefill_by_aggregates and m.decode_by_aggregates
    rng = np.random.default_rng(9)
    for _ in range(300):
        size = int(rng.integers(0, 64))
        contexts = [int(c) for c in rng.integers(1, 8000, size)]
        n = int(rng.integers(1, 4000))
        start = 0 if n > 1 else int(rng.integers(0, 8000))
        decode_last = n == 1 and rng.integers(2) == 1  # the last one decodes too
        reqs = [Request(i, 0.0, 10, 10) for i in range(size + 1)]
        listed = StepPlan(size + 1, sum(contexts) + start, 0 if decode_last else n,
                          size + (1 if decode_last else 0),
                          [(r, 1) for r in reqs[:size]] + [(reqs[size], n)], [*contexts, start])
        listed.num_singles = size
        sizes = StepPlan(size + 1, sum(contexts) + start, 0 if decode_last else n,
                         size + (1 if decode_last else 0))
        assert m.step_time(listed) == m.step_time(sizes), (size, n, start)


def test_roofline_subclass_that_counts_differently_gets_no_decode_step():
    class Slower(RooflineLatency):
        def step_time(self, plan: StepPlan) -> float:
            return 2 * super().step_time(plan)

    m = roofline()
    m.__class__ = Slower
    assert m.decode_step(4) is None and m.decode_ends(4) is None


ROOFLINE = {"engine.latency": {"type": "roofline", "model": "llama-2-7b", "gpu": "a100-80gb"}}


@pytest.mark.parametrize("overrides", [
    ROOFLINE,  # overloaded: runs end at finishes
    {**ROOFLINE, "workload.arrival.rate": 2.0, "policy.max_batch": 4},  # runs end at arrivals
], ids=["full", "light"])
def test_runs_with_a_roofline_model_equal_step_by_step(overrides):
    slow, fast = run_both(overrides, n=800)
    assert fast["events"] < slow["events"]  # runs took the place of steps
    assert_identical(slow, fast)


def finished_together(together: bool, on_end: bool):
    """Three running requests finish at once (with a slot request and ``slot_freed`` pending)."""
    env = simpy.Environment()
    rec = Recorder()
    ctx = SchedulerContext(env, rec)
    ctx.slots.capacity = 3
    ended: list[int] = []
    if on_end:
        ctx.on_end = lambda r: ended.append(r.id)
    reqs = [Request(i, 0.0, 10, 5) for i in range(3)]
    for r in reqs:
        ctx.admit(r)
        r.first_token = 1.0
    getter = ctx.slots.request()
    freed = ctx.slot_freed
    if together:
        ctx.finish_all(reqs, 2.5)
    else:
        for r in reqs:
            ctx.finish(r, 2.5)
    env.run()
    cols = rec.request_columns()
    return ({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in cols.items()},
            ctx.slots.count, ctx.slots.reserved, getter.triggered, freed.processed, ended,
            [(r.state, r.finish, r.last_token) for r in reqs])


@pytest.mark.parametrize("on_end", [False, True])
def test_finish_all_is_finish_one_by_one(on_end):
    together = finished_together(True, on_end)
    assert together == finished_together(False, on_end)
    cols, count, reserved, served, fired, ended, states = together
    assert cols["state"] == [int(RequestState.FINISHED)] * 3 and cols["finish"] == [2.5] * 3
    assert (count, reserved, served, fired) == (1, 1, True, True)  # the getter holds one
    assert ended == ([0, 1, 2] if on_end else [])
    assert states == [(RequestState.FINISHED, 2.5, 2.5)] * 3


@pytest.mark.parametrize("ids", [
    [], [5], [3, 1, 2], [0, 0, 1, 1, 1], list(range(1000)) * 2,
    [10**12, 1, 10**12],  # a sparse range: sorted instead
    [-4, -4, 7],
])
def test_distinct_count_is_the_number_of_unique_ids(ids):
    a = np.array(ids, dtype=np.int64)
    assert distinct_count(a) == np.unique(a).size


@pytest.mark.parametrize("overrides", [
    {},
    {"workload.arrival.rate": 4.0, "metrics.warmup": 0.1},
])
def test_summary_without_classes_tenants_or_reasons_skips_no_key(monkeypatch, overrides):
    sc = orcasim.load_scenario("seed_orca").override(
        {"workload.num_requests": 300, **overrides})
    quick = orcasim.simulate(sc, variants=["continuous"])["continuous"].summary
    calls = []
    group = summary_mod.group_summary

    def spy(*a, **kw):
        calls.append(1)
        return group(*a, **kw)

    monkeypatch.setattr(summary_mod, "group_summary", spy)
    monkeypatch.setattr(summary_mod, "_all_none", lambda col: False)  # the group pass always
    full = orcasim.simulate(sc, variants=["continuous"])["continuous"].summary
    assert calls  # the group pass ran, and added nothing
    assert list(full) == list(quick)
    np.testing.assert_equal(full, quick)


class AllRows(BinnedSeries):
    """Rebins every row at each block (the series without its shortcut)."""

    def add_columns(self, t0, t1, columns):
        dt = t1 - t0
        raw = {"t_start": t0, "t_end": t1, "num_steps": np.ones_like(t0), "busy": dt}
        for v, col in zip(self.values, columns, strict=True):
            raw[f"{v}_dt"] = col * dt
        agg = {f: np.concatenate([self._agg[f], raw[f]]) for f in self._fields}
        self._agg, self.width = rebin(agg, self.width, self.capacity)


@pytest.mark.parametrize("capacity,blocks", [
    (16, [16] * 40),  # the recorder's blocks: whole bins while the width is at most a block
    (16, [3, 16, 5, 1, 16, 16, 7, 30, 2] * 6),  # any sizes: bins left partial between blocks
    (4096, [4096] * 3),
    (5, [1] * 50),
])
def test_series_merging_only_its_last_rows_is_rebinning_them_all(capacity, blocks):
    rng = np.random.default_rng(3)
    quick, full = BinnedSeries(("a", "b"), capacity), AllRows(("a", "b"), capacity)
    t = 0.0
    for size in blocks:
        d = rng.exponential(0.01, size)
        t1 = t + np.cumsum(d)
        t0 = np.concatenate([[t], t1[:-1]])
        cols = [rng.integers(1, 64, size).astype(float), rng.exponential(100.0, size)]
        quick.add_columns(t0, t1, cols)
        full.add_columns(t0, t1, cols)
        t = t1[-1]
        assert quick.width == full.width
        for f, a in full._agg.items():
            np.testing.assert_array_equal(quick._agg[f], a, err_msg=f)
    assert full.width > 1
