"""Token-level policies with a memory section take runs of unchanged steps, exactly.

Each scenario runs step by step (``Engine.fast_paths = False``) and with runs
(``orcasim/policies/token_mem_runs.py``), and everything the recorder holds
is compared: requests' rows and the order they end in, inter-token gaps, the
step series, the memory series and summary, preemptions.
"""

from __future__ import annotations

import pytest

from orcasim.policies.token_mem_runs import MemoryRuns
from tests.test_batch_runs import assert_identical, run_both

POLICIES = {
    "fcfs": {"type": "fcfs"},
    "sarathi": {"type": "sarathi", "token_budget": 256},
    "sarathi-no-chunks": {"type": "sarathi", "token_budget": 512, "chunked_prefill": False},
    "prefill-first": {"type": "prefill-first"},
    "decode-first": {"type": "decode-first", "refill_below": 4},
    "priority-preempt": {"type": "priority", "preempt": True},
    "srpt": {"type": "srpt", "sigma": 0.5},
    "srpt-true-lengths": {"type": "srpt"},
    "sjf": {"type": "sjf"},
    "edf": {"type": "edf", "default_deadline": 30.0},
    "vtc": {"type": "vtc"},
}

MEMORY = {
    "ample": {"block_size": 16, "num_blocks": 100_000},
    # blocks run out: runs end before a boundary that might preempt, the head waits for memory
    "tight": {"block_size": 16, "num_blocks": 150},
    "tight-small-blocks": {"block_size": 4, "num_blocks": 1500},
    "watermark": {"block_size": 16, "num_blocks": 500},
    "oracle": {"allocator": "oracle", "block_size": 16, "num_blocks": 400},
    "swap": {"block_size": 16, "num_blocks": 300, "bytes_per_token": 1000,
             "swap_space_gb": 0.002, "pcie_bandwidth": 1e9},
}

#: policies that take runs under memory (the fair-share ones still step one at a time)
RUNS = {"fcfs", "sarathi", "sarathi-no-chunks", "prefill-first", "decode-first",
        "priority-preempt", "srpt", "srpt-true-lengths", "sjf", "edf"}


def scenario(name: str, memory: str, rate: float) -> dict:
    policy = {**POLICIES[name], "max_batch": 16}
    if memory == "watermark":
        policy["watermark"] = 0.05
    if memory == "swap":
        policy["preemption"] = "swap"
    over = {"policy": policy, "variants": None, "workload.arrival.rate": rate,
            "engine.latency.per_prefill_token": 0.0001, "memory": MEMORY[memory]}
    if name in ("priority-preempt", "vtc"):
        over["workload.classes"] = [
            {"name": "interactive", "weight": 1, "priority": 0, "tenant": "a"},
            {"name": "batch", "weight": 2, "priority": 1, "tenant": "b"}]
    return over


@pytest.fixture
def in_runs(monkeypatch) -> list[int]:
    """The steps taken in runs, counted as the runs complete."""
    steps = [0]
    complete = MemoryRuns.complete_run

    def spy(self, plan, ends):
        steps[0] += len(ends)
        complete(self, plan, ends)

    monkeypatch.setattr(MemoryRuns, "complete_run", spy)
    return steps


@pytest.mark.parametrize("memory", ["ample", "tight"])
@pytest.mark.parametrize("rate", [30.0, 3.0])
@pytest.mark.parametrize("name", POLICIES)
def test_token_policy_runs_with_memory_equal_per_step_simulation(name, memory, rate, in_runs):
    slow, fast = run_both(scenario(name, memory, rate), n=500, variant=None)
    assert_identical(slow, fast)
    if name in RUNS:  # runs took the place of most steps
        assert in_runs[0] > fast["num_steps"] * (0.2 if memory == "tight" else 0.5)
    else:
        assert in_runs[0] == 0
    if memory == "tight" and rate == 30.0:
        assert fast["preemptions"]["num_preemptions"] > 50


@pytest.mark.parametrize("memory", ["tight-small-blocks", "watermark", "oracle", "swap"])
@pytest.mark.parametrize("name", ["fcfs", "sarathi", "srpt", "priority-preempt"])
def test_token_policy_runs_with_other_memory_equal_per_step_simulation(name, memory, in_runs):
    slow, fast = run_both(scenario(name, memory, 30.0), n=400, variant=None)
    assert_identical(slow, fast)
    assert in_runs[0] > fast["num_steps"] * 0.2


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeds_and_a_stop_inside_a_run(seed):
    over = {**scenario("fcfs", "tight", 30.0), "seed": seed}
    slow, fast = run_both(over, n=400, variant=None, stop_at=9.0)
    assert_identical(slow, fast)


def test_a_run_ends_before_a_boundary_the_free_blocks_do_not_cover(monkeypatch):
    """The runs offered under a tight pool stop where the blocks run out: a run's later
    boundaries never find a request short of a block (none preempts within a run)."""
    seen: list[tuple[int, int]] = []
    offer = MemoryRuns.decode_run

    def spy(self, plan=None):
        run = offer(self, plan)
        if run is not None:
            seen.append((run[2], self.alloc.num_free_blocks))
        return run

    monkeypatch.setattr(MemoryRuns, "decode_run", spy)
    slow, fast = run_both(scenario("fcfs", "tight", 30.0), n=400, variant=None)
    assert_identical(slow, fast)
    assert len(seen) > 100
    assert any(free < 16 for _, free in seen)  # runs were offered with few blocks free


def allocator_at_each_boundary(monkeypatch, name: str, memory: str
                                ) -> dict[bool, dict[float, tuple]]:
    """The allocator's free blocks, blocks per request, internal fragmentation and peak at
    each boundary the engine plans, by time, step by step (False) and with runs (True),
    after checking that both give the same results."""
    from orcasim.engine import Engine
    from orcasim.policies.common import BatchPolicy

    seen: dict[bool, dict[float, tuple]] = {False: {}, True: {}}
    plan = BatchPolicy.next_step

    def spy(self):
        kv = self.ctx.kv
        alloc = kv.alloc
        seen[Engine.fast_paths].setdefault(self.ctx.env.now, (
            alloc.num_free_blocks, sorted(alloc.held.items()), alloc.internal_slots,
            sorted(alloc._internal.items()), kv.peak_allocated))
        return (yield from plan(self))

    monkeypatch.setattr(BatchPolicy, "next_step", spy)
    slow, fast = run_both(scenario(name, memory, 30.0), n=300, variant=None)
    assert_identical(slow, fast)
    return seen


@pytest.mark.parametrize("name", ["fcfs", "srpt-true-lengths", "prefill-first"])
def test_the_pool_at_each_boundary_after_a_run_is_the_step_by_step_one(monkeypatch, name):
    """At every boundary the engine plans (a run's end included) the free blocks, each
    request's blocks, internal fragmentation and peak are those step by step."""
    seen = allocator_at_each_boundary(monkeypatch, name, "tight")
    assert len(seen[True]) < len(seen[False]) * 0.6  # runs skipped most boundaries
    for t, state in seen[True].items():
        assert seen[False][t] == state, t


#: the policies whose running requests decode together in a decode pool under memory
POOLED = {"fcfs", "sarathi", "sarathi-no-chunks", "priority-preempt", "srpt",
          "srpt-true-lengths", "sjf", "edf"}


@pytest.fixture
def pooled_runs(monkeypatch) -> list[int]:
    """The runs completed with decode pool members among their requests."""
    from orcasim.policies.token_mem_pool import PooledMemoryRuns

    count = [0]
    complete = PooledMemoryRuns.complete_pooled

    def spy(self, plan, ends):
        noted, m, _ = self.policy._pooled
        count[0] += noted is plan and m > 0
        complete(self, plan, ends)

    monkeypatch.setattr(PooledMemoryRuns, "complete_pooled", spy)
    return count


@pytest.mark.parametrize("memory", ["ample", "tight", "tight-small-blocks", "swap", "oracle"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_runs_with_and_without_the_decode_pool_equal_per_step_simulation(
        name, memory, monkeypatch, pooled_runs):
    """Under memory the running requests decode together in a decode pool where the policy
    allows one (their blocks taken by phase); with ``MemoryRuns.pooled`` off each run's end
    is a pass over them. Both are step-by-step simulation, bit for bit."""
    over = scenario(name, memory, 30.0)
    slow, fast = run_both(over, n=300, variant=None)
    assert_identical(slow, fast)
    if name in POOLED:
        assert pooled_runs[0] > 20
    else:
        assert pooled_runs[0] == 0
    monkeypatch.setattr(MemoryRuns, "pooled", False)
    before = pooled_runs[0]
    _, unpooled = run_both(over, n=300, variant=None)
    assert_identical(slow, unpooled)
    assert pooled_runs[0] == before


@pytest.mark.parametrize("name", ["sarathi", "srpt", "priority-preempt"])
@pytest.mark.parametrize("memory", ["tight", "swap"])
def test_the_blocks_at_each_boundary_with_the_decode_pool(monkeypatch, name, memory):
    """With the decode pool the allocator's blocks per request, free count, internal
    fragmentation and peak are those of step-by-step simulation at every boundary."""
    seen = allocator_at_each_boundary(monkeypatch, name, memory)
    assert len(seen[True]) < len(seen[False]) * 0.8
    for t, state in seen[True].items():
        assert seen[False][t] == state, t
