"""Contiguous reservations, capacity from model and GPU, reservation sizes, KVPool events."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import orcasim
from orcasim.hardware import GB, MODELS
from orcasim.kv.config import MemoryOptions, kv_blocks, next_pow2, reservation, resolve
from orcasim.kv.contiguous import BuddySpace, ContiguousSpace
from orcasim.kv.pool import KVPool
from orcasim.policies.base import TokenPolicy
from orcasim.request import Request


def test_first_fit_holes_and_merging():
    s = ContiguousSpace(10)
    assert s.reserve("a", 3) == 0 and s.reserve("b", 4) == 3 and s.reserve("c", 2) == 7
    assert s.holes == [(9, 1)] and s.num_free == 1
    s.release("b")
    assert s.holes == [(3, 4), (9, 1)]
    assert s.reserve("d", 5) is None  # 5 slots are free, but not in one run
    assert s.largest_hole == 4 and s.fits(4) and not s.fits(5)
    assert s.reserve("e", 2) == 3  # first fit: the lowest hole that is big enough
    s.release("c")  # merges with the hole after: (7, 3)
    s.release("a")
    assert s.holes == [(0, 3), (5, 5)]
    s.release("e")  # merges with both neighbours
    assert s.holes == [(0, 10)] and s.num_free == 10
    s.check()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_random_reservations_tile_the_space(ops):
    s = ContiguousSpace(40)
    live: list[int] = []
    for i, (reserve, x) in enumerate(ops):
        if reserve or not live:
            first = next((a for a, n in s.holes if n >= x), None)  # first fit, or none
            start = s.reserve(i, x)
            assert start == first
            if start is not None:
                live.append(i)
        else:
            s.release(live.pop(x % len(live)))
        s.check()
        assert s.num_free + sum(n for _, n in s.regions.values()) == 40


def test_buddy_chunks_split_align_and_merge():
    b = BuddySpace(22)  # top-level chunks 16 at 0, 4 at 16, 2 at 20
    assert b.holes == [(0, 16), (16, 4), (20, 2)]
    assert b.reserve("a", 3) == 16  # a 4-slot chunk: the 4-chunk, 1 slot of padding
    assert b.reserve("b", 5) == 0  # 8 slots: the 16 is split into 8 + 8
    assert b.reserve("c", 2) == 20
    assert b.reserve("d", 1) == 8  # the free 8 is split down to 1
    assert b.holes == [(9, 1), (10, 2), (12, 4)]
    assert b.reserve("e", 5) is None  # 7 slots free, no chunk of 8
    assert b.regions["b"] == (0, 8) and b.num_free == 7
    b.check()
    b.release("d")  # merges 1+1, 2+2, 4+4 back into the 8 at 8
    assert b.holes == [(8, 8)]
    b.release("b")  # and the two 8s into the 16; the 4 at 16 is its own top chunk
    b.release("a")
    b.release("c")
    assert b.holes == [(0, 16), (16, 4), (20, 2)] and b.num_free == 22
    b.check()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_random_buddy_reservations_tile_the_space(ops):
    b = BuddySpace(45)
    live: list[int] = []
    for i, (reserve, x) in enumerate(ops):
        if reserve or not live:
            fits = b.fits(x)
            start = b.reserve(i, x)
            assert (start is not None) == fits
            if start is not None:
                live.append(i)
                assert b.regions[i][1] == BuddySpace.chunk_size(x)
        else:
            b.release(live.pop(x % len(live)))
        b.check()
    for i in live:
        b.release(i)
    assert b.holes == [(0, 32), (32, 8), (40, 4), (44, 1)]


def test_kv_bytes_and_blocks_for_opt_13b_on_a100_40gb():
    m = MODELS["opt-13b"]
    assert m.kv_bytes_per_token() == 2 * 40 * 40 * 128 * 2 == 819_200
    # (0.9 x 40 GB - 25.7 GB of weights - 1 GB activations) / (16 x 819,200 B)
    free = 0.9 * 40e9 - 12.85e9 * 2 - 1e9
    assert kv_blocks("opt-13b", 40e9, activation_reserve=1e9) == int(free // (16 * 819_200))
    assert kv_blocks("opt-13b", 40e9, activation_reserve=1e9) == 709
    # tensor parallelism halves the weights and the KV heads per GPU
    assert kv_blocks("llama-2-13b", 40e9, tp=2) == int(
        (0.9 * 40e9 - 13.02e9) // (16 * 2 * 40 * 20 * 128 * 2))
    # Llama-3.1 70B with 8 KV heads on 4 H100s: 2 KV heads per GPU
    assert MODELS["llama-3.1-70b"].kv_bytes_per_token(4) == 2 * 80 * 2 * 128 * 2


def test_memory_options_resolve_and_errors():
    lay = resolve(MemoryOptions(model="opt-13b", gpu="a100-40gb", activation_reserve_gb=1))
    assert (lay.num_blocks, lay.block_size, lay.bytes_per_token, lay.max_model_len) == (
        709, 16, 819_200, 2048)
    assert lay.num_swap_blocks == int(4 * GB // (16 * 819_200)) == 305
    assert lay.pcie_bandwidth == 25e9
    lay = resolve(MemoryOptions(num_blocks=100, block_size=8))
    assert (lay.num_blocks, lay.capacity_tokens, lay.bytes_per_token) == (100, 800, None)
    assert lay.num_swap_blocks == 0
    sc = {"workload": {"type": "list", "requests": [{"prompt_len": 1, "output_len": 1}]},
          "policy": "continuous"}
    with pytest.raises(orcasim.ScenarioError, match=r"memory: .*give num_blocks, or model and gpu"):
        orcasim.Scenario({**sc, "memory": {"block_size": 16}})
    with pytest.raises(orcasim.ScenarioError, match=r"memory.model: .*unknown model 'gpt-5'"):
        orcasim.Scenario({**sc, "memory": {"model": "gpt-5", "gpu": "a100-40gb"}})
    with pytest.raises(orcasim.ScenarioError, match=r"memory: .*no room for KV blocks: 0.9 x 24"):
        orcasim.Scenario({**sc, "memory": {"model": "llama-2-70b", "gpu": "a10g"}})
    with pytest.raises(orcasim.ScenarioError, match=r"memory.block_size: .*greater than 0"):
        orcasim.Scenario({**sc, "memory": {"num_blocks": 4, "block_size": 0}})
    # a custom policy that allocates no memory is refused up front; the built-in ones run
    with pytest.raises(orcasim.ScenarioError,
                       match="policy 'test-no-memory' does not allocate KV memory"):
        orcasim.simulate(orcasim.Scenario({**sc, "policy": "test-no-memory",
                                           "memory": {"num_blocks": 4}}))
    v = orcasim.simulate(orcasim.Scenario({**sc, "policy": "static",
                                           "memory": {"num_blocks": 4}}))
    assert next(iter(v.values())).summary["num_finished"] >= 1


@orcasim.register_policy("test-no-memory")
class NoMemory(TokenPolicy):
    """Every request runs at once, with no KV memory bookkeeping (tests only)."""

    def next_step(self):
        ctx = self.ctx
        while True:
            ctx.poll_arrivals()
            while ctx.waiting:
                req = ctx.waiting.popleft()
                ctx.admit(req)
                self.running.append(req)
            if self.running:
                return self.continue_step()
            if ctx.arrivals_done:
                return None
            yield ctx.arrival


def test_reservation_sizes():
    lay = resolve(MemoryOptions(num_blocks=100, max_model_len=64))
    assert next_pow2(1) == 1 and next_pow2(25) == 32 and next_pow2(32) == 32
    for alloc, want in (("oracle", 10 + 25 - 1), ("pow2", 10 + 32 - 1), ("max", 64)):
        lay2 = resolve(MemoryOptions(num_blocks=100, max_model_len=64, allocator=alloc))
        assert reservation(lay2, 10, 25) == want
    # pow2 never reserves beyond max_model_len
    lay2 = resolve(MemoryOptions(num_blocks=100, max_model_len=64, allocator="pow2"))
    assert reservation(lay2, 30, 33) == 64
    with pytest.raises(ValueError):
        reservation(lay, 1, 1)


def pool(num_blocks=4, block_size=2, **kw):
    env = simpy.Environment()
    return env, KVPool(env, resolve(MemoryOptions(num_blocks=num_blocks, block_size=block_size,
                                                  **kw)))


def test_blocking_get_waits_for_put_first_come_first_served():
    env, kv = pool(4)
    log = []

    def holder():
        n = yield kv.get(3)
        log.append(("holder", env.now, n))
        yield env.timeout(5)
        kv.put(n)

    def taker(name, n, delay):
        yield env.timeout(delay)
        got = yield kv.get(n)
        log.append((name, env.now, got))

    env.process(holder())
    env.process(taker("big", 3, 1))  # waits for the holder
    env.process(taker("small", 1, 2))  # 1 block is free, but it queues behind "big"
    env.run()
    assert log == [("holder", 0, 3), ("big", 5, 3), ("small", 5, 1)]
    assert kv.free_units == 0


def test_freed_event_fires_on_release_with_the_free_count():
    env, kv = pool(4)
    req = Request(0, 0.0, 5, 2)
    assert kv.admit(req) and kv.free_units == 1
    log = []

    def waiter():
        n = yield kv.freed
        log.append((env.now, n))

    def finisher():
        yield env.timeout(2.5)
        kv.release(req)

    env.process(waiter())
    env.process(finisher())
    env.run()
    assert log == [(2.5, 4)]


def test_admission_waits_behind_a_blocking_get_and_resumes_on_freed():
    """A policy that cannot admit waits on kv.freed, not by polling."""
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": [{"name": "A", "prompt_len": 4,
                                                   "output_len": 2}]},
        "engine": {"latency": {"type": "constant", "step_time": 1.0}},
        "policy": {"type": "continuous"},
        "memory": {"num_blocks": 4, "block_size": 2},
    })
    from orcasim.context import SchedulerContext
    from orcasim.engine import Engine
    from orcasim.metrics.recorder import Recorder
    from orcasim.simulation import generate_workload
    from orcasim.source import OpenLoopSource

    cfg = sc.variants[0]
    env = simpy.Environment()
    rec = Recorder()
    ctx = SchedulerContext(env, rec)
    ctx.kv = KVPool.from_options(env, cfg.memory, rec)

    def other_user():  # holds 3 of the 4 blocks from t=0 to t=7
        n = yield ctx.kv.get(3)
        yield env.timeout(7)
        ctx.kv.put(n)

    env.process(other_user())
    OpenLoopSource(env, ctx, generate_workload(cfg))
    Engine(env, ctx, cfg.policy.create(ctx), cfg.latency.create())
    env.run()
    cols = rec.request_columns()
    assert cols["first_scheduled"].tolist() == [7.0] and cols["finish"].tolist() == [9.0]


def test_series_bins_stay_uniform_across_flushes():
    """Old and new rows cover the same number of steps; totals stay exact."""
    import numpy as np

    from orcasim.metrics.kv_series import KVSeries
    from orcasim.metrics.series import StepSeries

    s = StepSeries(capacity=8)
    for k in range(5):  # five blocks of 13 steps: 65 steps, width 16 -> 4 full rows + 1
        t = np.arange(13.0) + 13 * k
        s.add_steps(t, t + 1, np.full(13, 2.0), np.ones(13), np.full(13, float(k)))
    rows = s.rows()
    assert s.width == 16 and rows["num_steps"].tolist() == [16, 16, 16, 16, 1]
    assert rows["t_start"].tolist() == [0, 16, 32, 48, 64] and rows["t_end"][-1] == 65
    assert rows["batch_size"].tolist() == [2.0] * 5
    assert float(np.dot(rows["num_waiting"], rows["busy"])) == sum(13 * k for k in range(5))
    kv = KVSeries(capacity=4, total=20)
    for i in range(10):
        kv.add(float(i), i + 1.0, i, 10, 0, 0, 0, i % 2 == 1)
    rows = kv.rows()
    assert kv.width == 4 and rows["num_steps"].tolist() == [4, 4, 2]
    assert rows["tokens"].tolist() == [1.5, 5.5, 8.5]
    assert rows["free"].tolist() == [10.0, 10.0, 10.0]
    assert rows["stranded"].tolist() == [5.0, 5.0, 5.0]  # free in every other step
    assert kv.totals()["tokens_dt"] == sum(range(10))


def test_kv_series_float_array_is_numpys_conversion():
    """The series' list-to-array conversion gives numpy's doubles, bit for bit."""
    from orcasim.metrics.kv_series import float_array

    rng = np.random.default_rng(5)
    values = [float(x) for x in rng.uniform(-1e9, 1e9, 500)]
    values += [int(x) for x in rng.integers(-2**53, 2**53, 500)]
    values += [True, False, 0, -0.0, 1e-310, float("inf"), -float("inf"), 2**60 + 1, 7]
    rng.shuffle(values)
    for chunk in (values, values[:1], []):
        got, want = float_array(chunk), np.array(chunk, dtype=np.float64)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        got[:1] = 0.0  # writable, like numpy's
    ints = [int(x) for x in rng.integers(-2**62, 2**62, 300)] + [0, 1, -1, 2**53 + 1, 2**63 - 1]
    ints += [True, 2**64, -2**70]  # beyond 64 bits: numpy's own conversion
    for chunk in (ints, ints[:-2], ints[:1], []):
        got, want = float_array(chunk, "q"), np.array(chunk, dtype=np.float64)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        got[:1] = 0.0
