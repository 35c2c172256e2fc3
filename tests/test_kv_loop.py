"""The engine's loop over whole runs of a continuous batch in a paged KV pool, against the
policy's own runs and against step-by-step simulation.

:class:`~orcasim.policies.kv_loop.KVDecodeLoop` takes run after run of ``continuous`` with a
paged memory limit in one frame, and hands each boundary whose growth the free blocks do not
cover to the engine. Every test runs the same model three ways (the loop; runs through the
policy and recorder, ``KVDecodeLoop.enabled = False``; one event per step,
``Engine.fast_paths = False``) and compares everything the run records, memory rows and the
order in which request rows were written included.
"""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.engine import Engine
from orcasim.errors import SimulationError
from orcasim.policies.kv_loop import KVDecodeLoop
from orcasim.policies.kv_preempt import KVPreemption
from orcasim.sched import decode_growth
from orcasim.simulation import build_model, generate_workload
from tests.test_batch_runs import assert_identical, running_ids, snapshot, watch_and_stop

WAYS = ("loop", "runs", "steps")
TIGHT = {"block_size": 16, "num_blocks": 400}


def pool_check(ctx) -> tuple[int, int, int, int]:
    """The pool's allocated blocks and internal slots, and what the batch's members need
    for the known tokens of the step in progress (a member's blocks hold its prompt and
    generated tokens; once it holds its final block, the unused tail is internal)."""
    policy, alloc = ctx.policy, ctx.kv.alloc
    bs = alloc.block_size
    need = internal = 0
    for r in policy.batch:
        p = max(r.prompt_len, 1)
        n = -(-(p + policy.batch.output_tokens(r)) // bs)
        need += n
        if n * bs >= p + r.output_len - 1:
            internal += n * bs - (p + r.output_len - 1)
    return alloc.capacity_units - alloc.num_free_blocks, need, alloc.internal_slots, internal


def run_three(overrides: dict, n: int = 1500, watch: float | None = None,
              stop_at: float | None = None, check: bool = False) -> dict[str, dict]:
    """The seed scenario's ``continuous`` variant with ``overrides``, each way; ``watch``: a
    process wakes every ``watch`` seconds (``check``: and compares the pool's blocks with its
    members' tokens, :func:`pool_check`); ``stop_at``: a hard stop then."""
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": n, **overrides})
    cfg = sc.variant("continuous")
    arrays = generate_workload(cfg)
    out = {}
    for way in WAYS:
        Engine.fast_paths = way != "steps"
        KVDecodeLoop.enabled = way == "loop"
        try:
            m = build_model(cfg, arrays)

            def probe(ctx):
                if check:
                    held, need, internal, tails = pool_check(ctx)
                    assert (held, internal) == (need, tails), ctx.env.now
                return running_ids(ctx)

            seen = watch_and_stop(m, len(arrays), watch, stop_at, probe)
            looped = [0]  # steps of the runs the loop made
            record_decode_runs = m.recorder.record_decode_runs

            def spy(runs, record=record_decode_runs, looped=looped):
                looped[0] += sum(r[1] for r in runs)
                record(runs)

            m.recorder.record_decode_runs = spy
            error = None
            try:
                m.env.run()
            except SimulationError as err:
                error = str(err)
        finally:
            Engine.fast_paths = True
            KVDecodeLoop.enabled = True
        rec = m.recorder
        assert isinstance(m.engine._loop, KVDecodeLoop) == (way == "loop")
        rec._write_done()
        out[way] = {
            "order": np.frombuffer(rec._i["id"], dtype=np.int64).copy() if rec._i["id"] else
            np.zeros(0, np.int64),
            "num_recorded": rec.num_recorded,
            "num_arrived": rec.num_arrived,
            "num_started": m.ctx.num_started,
            "seen": seen,
            "error": error,
            "looped": looped[0],
            **snapshot(m),
            "releases": m.ctx.kv.num_releases,
            "leaked": m.ctx.kv.leaked_blocks(),
            "light": getattr(m.engine._loop, "light", None),
        }
    return out


def assert_three_identical(out: dict[str, dict]) -> None:
    loop = out["loop"]
    for way in ("runs", "steps"):
        other = out[way]
        assert_identical(other, loop)
        np.testing.assert_array_equal(other["order"], loop["order"], err_msg=way)
        for key in ("num_recorded", "num_arrived", "num_started", "seen", "error", "releases",
                    "leaked"):
            assert other[key] == loop[key], (way, key)


SCENARIOS = {
    "ample": {"memory": {"block_size": 16, "num_blocks": 100_000}},
    # refusals and preemptions: boundaries short of blocks go to the engine
    "tight": {"memory": TIGHT},
    "light": {"memory": {"block_size": 8, "num_blocks": 600}, "workload.arrival.rate": 1.5,
              "policy.max_batch": 8},
    "watermark": {"memory": TIGHT, "policy.watermark": 0.05, "policy.victim": "lowest_priority"},
    "max_model_len": {"memory": {**TIGHT, "max_model_len": 1100}},
    "swap": {"memory": {"block_size": 16, "num_blocks": 300, "bytes_per_token": 1000,
                        "swap_space_gb": 0.002, "pcie_bandwidth": 1e9},
             "policy.preemption": "swap"},
    "block_of_one": {"memory": {"block_size": 1, "num_blocks": 6000}},
    "roofline": {"memory": TIGHT, "engine.latency": {"type": "roofline", "model": "llama-2-7b",
                                                      "gpu": "a100-80gb"},
                 "workload.arrival.rate": 10.0},
    "classes": {"memory": TIGHT, "workload.classes": [
        {"name": "gold", "weight": 1, "priority": 1, "tenant": "t1"},
        {"name": "std", "weight": 3}]},
    # a preempted request outgrows the pool: the run stops with an error
    "small_pool": {"memory": {"block_size": 16, "num_blocks": 70}},
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_loop_equals_policy_runs_and_steps(name):
    out = run_three(SCENARIOS[name])
    assert_three_identical(out)
    loop = out["loop"]
    assert (loop["error"] is not None) == (name == "small_pool")
    if name in ("tight", "watermark", "swap", "classes"):
        assert loop["preemptions"]["num_preemptions"] > 50
    if name != "small_pool":
        assert loop["leaked"] == 0 and len(loop["order"]) == 1500
    assert out["runs"]["looped"] == 0
    # the backlog's requests join the loop's batch as workload rows, but for a victim rule the
    # loop does not take rows for, or per-request attributes
    assert loop["light"] == (name not in ("watermark", "classes"))
    if name == "swap":  # a boundary that preempts goes to the engine
        assert 0 < loop["looped"] < loop["num_steps"]
    elif name != "small_pool":  # the loop made the steps, preempting too (the engine makes
        assert loop["looped"] > 0.99 * loop["num_steps"]  # the first after an idle wait)


@pytest.mark.parametrize("name", ["ample", "tight", "classes"])
def test_loop_hands_runs_to_the_engine_before_other_events(name):
    out = run_three(SCENARIOS[name], n=600, watch=0.37)
    assert_three_identical(out)
    assert len(out["loop"]["seen"]) > 100


@pytest.mark.parametrize("name", ["ample", "tight"])
def test_a_hard_stop_after_loop_runs(name):
    out = run_three(SCENARIOS[name], n=400, stop_at=7.001)
    assert_three_identical(out)
    assert "test_stop" in set(out["loop"]["columns"]["reason"])


def test_preemption_in_place_equals_the_policys_victim_and_preempt(monkeypatch):
    """The exact round's preemptions by recompute of the last admitted, done in place,
    against :meth:`_victim` and :meth:`_preempt` one by one."""
    fast = run_three(SCENARIOS["tight"], n=800)["loop"]

    def generic(self):
        def take():
            victim = self._victim()
            self._preempt(victim)
            return victim.id
        return take

    monkeypatch.setattr(KVPreemption, "_recompute_newest", generic)
    slow = run_three(SCENARIOS["tight"], n=800)
    assert_three_identical(slow)
    assert fast["light"] and slow["loop"]["light"] is False  # (requests only)
    assert_identical(slow["loop"], fast)
    assert fast["preemptions"]["num_preemptions"] > 100


@pytest.mark.parametrize("name", ["ample", "tight", "light", "block_of_one", "classes"])
def test_pool_blocks_follow_the_members_tokens(name):
    """Between hand-backs the pool holds, for each member, the blocks of the tokens its step
    in progress reads, and internal slots for the final blocks' unused tails: the growth's
    rounds (members kept in their phase until they leave) and the loop's own bookkeeping
    against the members' token counts, every way."""
    out = run_three(SCENARIOS[name], n=500, watch=0.29, check=True)
    assert_three_identical(out)
    assert len(out["loop"]["seen"]) > 100


@pytest.mark.parametrize("name", ["ample", "tight", "block_of_one"])
def test_runs_past_the_ring_of_phases(monkeypatch, name):
    """A run's rounds are a slice of the growth's ring of phases; with a ring of one cycle
    most runs reach past its end, and their rounds are counted phase by phase."""
    monkeypatch.setattr(decode_growth, "RING", 1)
    out = run_three(SCENARIOS[name], n=600)
    assert_three_identical(out)
    assert out["loop"]["looped"] > 0.99 * out["loop"]["num_steps"]
