"""A decode pool's members take their paged blocks by phase, exactly as one by one.

:class:`~orcasim.policies.growing_pool.GrowingPool` keeps the allocator's blocks per
request, free count and internal fragmentation up to date at every boundary while
its members' token counters are written lazily. Here members join, decode in runs
and single steps, finish and leave at random, and at every boundary each member
holds the blocks its next token needs, as ``PagedAllocator.allocate_tokens`` would
give them.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from orcasim.kv.allocators import PagedAllocator
from orcasim.kv.config import MemoryLayout
from orcasim.policies.growing_pool import GrowingPool
from orcasim.request import Request


def layout(block_size: int) -> MemoryLayout:
    return MemoryLayout(allocator="paged", num_blocks=100_000, block_size=block_size,
                        bytes_per_token=None, max_model_len=None, num_swap_blocks=0,
                        pcie_bandwidth=1.0)


def newcomer(rid: int, rng: random.Random, alloc: PagedAllocator) -> Request:
    """A request that has just emitted some tokens, holding blocks for those it computed."""
    req = Request(rid, 0.0, rng.randint(0, 40), rng.randint(2, 60))
    out = rng.randint(1, req.output_len - 1)
    req.num_output_tokens = out
    req.num_computed_tokens = max(req.prompt_len, 1) + out - 1
    assert alloc.allocate_tokens(req, req.num_computed_tokens)
    return req


def check(pool: GrowingPool, alloc: PagedAllocator) -> None:
    """Every member holds the blocks for the token its next step computes; the allocator's
    aggregates agree with its per-request counts."""
    bs = alloc.block_size
    for req in pool.reqs:
        need = -(-(pool.context(req) + 1) // bs)
        assert alloc.held[req.id] == need, req.id
        p = max(req.prompt_len, 1)
        tail = need * bs - (p + req.output_len - 1)
        assert alloc._internal.get(req.id) == (tail if tail >= 0 else None), req.id
    assert alloc.num_free_blocks == alloc.layout.num_blocks - sum(alloc.held.values())
    assert alloc.internal_slots == sum(alloc._internal.values())


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_by_phase_equal_blocks_one_by_one(block_size, seed):
    rng = random.Random(seed)
    alloc = PagedAllocator(layout(block_size))
    kv = SimpleNamespace(peak_allocated=0)
    pool = GrowingPool(alloc)
    rid = 0
    t = 0.0
    for _ in range(400):
        # the boundary: its round, then the members as the step rule would see them
        before = alloc.num_free_blocks
        assert pool.grow_now(kv)
        if alloc.num_free_blocks < before:  # (the peak as the round's allocations note it)
            assert kv.peak_allocated >= alloc.allocated_slots
        check(pool, alloc)
        if pool.reqs and rng.random() < 0.1:  # one leaves (preempted, aborted)
            req = rng.choice(pool.reqs)
            pool.leave(req)
            alloc.release(req)
        joining = []
        for _ in range(rng.randint(0, 2)):
            joining.append(newcomer(rid, rng, alloc))
            rid += 1
        if rng.random() < 0.3:  # they join at this boundary, their blocks given by the step
            for req in joining:  # rule (at a run's end, the next round gives them)
                assert alloc.allocate_tokens(req, req.num_computed_tokens + 1)
            pool.join_all(joining)
            joining = []
        # a run of k steps (nobody finishes before its last): its rounds, then its end
        k = min(rng.randint(1, 12), pool.first_finish())
        grow, tails = [0] * k, [0] * k
        pool.rounds(grow, tails)
        alloc.num_free_blocks -= sum(grow)
        alloc.internal_slots += sum(tails)
        t += 1.0
        done, _ = pool.end_run(k, t, joining)
        for req in done:
            assert req.num_output_tokens == req.output_len
            alloc.release(req)
    assert rid > 100


def test_a_round_the_free_blocks_do_not_cover_is_left_to_the_step_rule():
    """The members due have their counters written (the step rule's own pass gives each
    its block, preempting as it must) and stay members until the next boundary's pass."""
    alloc = PagedAllocator(MemoryLayout(allocator="paged", num_blocks=5, block_size=4,
                                        bytes_per_token=None, max_model_len=None,
                                        num_swap_blocks=0, pcie_bandwidth=1.0))
    pool = GrowingPool(alloc)
    reqs = []
    for rid, output in enumerate((7, 20)):  # the first's footprint: 3 + 7 - 1 = 9 tokens
        req = Request(rid, 0.0, 3, output)
        req.num_output_tokens = 1
        req.num_computed_tokens = 3  # holds one block, full after its next step
        assert alloc.allocate_tokens(req, 4)
        reqs.append(req)
    pool.join_all(reqs)
    kv = SimpleNamespace(peak_allocated=0)
    done, _ = pool.end_run(1, 1.0, [])  # both now need a second block: three are free
    assert not done and pool.grow_now(kv) and alloc.num_free_blocks == 1
    pool.end_run(4, 2.0, [])  # a third each (the first's final one), one free
    assert not pool.grow_now(kv)
    assert pool.size == 2 and pool.exact_round == pool.steps == 5
    assert [(r.num_computed_tokens, r.num_output_tokens) for r in reqs] == [(8, 6), (8, 6)]
    assert [alloc.held[r.id] for r in reqs] == [2, 2] and alloc.num_free_blocks == 1
    pool.settle()  # (the step rule's pass at this boundary: the pool stays)
    assert pool.size == 2
    assert alloc.allocate_tokens(reqs[0], 9)  # (its final block, in that pass)
    assert alloc._internal == {0: 3}
    assert pool.due_at(9) == 1  # (the other only: it takes no other block)
    done, _ = pool.end_run(1, 3.0, [])  # its last token
    assert done == [reqs[0]] and reqs[0].num_output_tokens == 7 and pool.phase_of == {1: 1}
    pool.settle()  # (a later boundary's pass: the pool is emptied, up to date)
    assert pool.size == 0 and reqs[1].num_computed_tokens == 9
