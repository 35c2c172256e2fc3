"""Blocks made when first taken (UnusedBlocks) against a pool that made them all up front:
the same blocks taken, the same free-queue order, counts and prefix cache, every golden
trace the same, block ids included."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orcasim.kv import block_stack, free_queue
from orcasim.kv.block_pool import BlockPool
from orcasim.kv.block_stack import BlockStack
from orcasim.kv.cache_manager import KVCacheManager, ReuseFirstBlockPool
from orcasim.request import Request
from orcasim.steptrace import load_workload, run_trace

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"


@pytest.fixture(params=[1, 5, free_queue.SPILL_AT_LEAST])
def spill(request, monkeypatch):
    """Unused blocks made at once at least: one, a few, as it stands."""
    monkeypatch.setattr(free_queue, "SPILL_AT_LEAST", request.param)
    monkeypatch.setattr(block_stack, "SPILL_AT_LEAST", request.param)
    return request.param


def order(pool: BlockPool) -> list[int]:
    """The free queue's block ids, head first, those never made in their place (making
    none); the links are checked on the way."""
    queue = pool.free_queue
    unused = pool._unused
    never = list(range(unused.next_id, unused.num_blocks))
    if type(queue) is BlockStack:
        return [b.block_id for b in queue.made()] + never
    out: list[int] = []
    prev, b = queue._head, queue._head.next_free
    while b is not queue._tail:
        assert b.prev_free is prev
        if b is queue._unused_node:
            assert never, "the unused node stays after the last block is made"
            out += never
        else:
            out.append(b.block_id)
        prev, b = b, b.next_free
    assert queue._tail.prev_free is prev
    return out


def state(pool: BlockPool) -> tuple[object, ...]:
    made = pool.made_blocks
    refs = [b.ref_cnt for b in made] + [0] * (pool.num_blocks - len(made))
    cached = {h: sorted(d) for h, d in pool.cached.items()}
    pool.check()
    return (order(pool), pool.num_free_blocks, refs, cached, pool.version,
            pool.num_evictions)


def twins(cls: type[BlockPool], caching: bool, null: bool) -> tuple[BlockPool, BlockPool]:
    """A pool making its blocks when taken, and one that made them all up front."""
    lazy = cls(48, 2, enable_caching=caching, null_block=null)
    eager = cls(48, 2, enable_caching=caching, null_block=null)
    assert len(eager.blocks) == 48 and eager._unused.left == 0
    assert len(lazy.made_blocks) == (free_queue.SPILL_AT_LEAST if null else 0)
    return lazy, eager


def pool_op(pool: BlockPool, seqs: list[list], op: int, x: int, y: int) -> object:
    """One operation on ``pool``; ``x`` and ``y`` pick the sizes, sequences and contents."""
    if op == 0:  # new blocks, some of them cached
        got = pool.get_new_blocks(x)
        if got is None:
            return None
        for i, b in enumerate(got[: y % 3]):
            pool.cache_block(b, (y % 4, i))
        seqs.append(got)
        return [b.block_id for b in got]
    if op == 1 and seqs:  # a sequence freed, tail first
        pool.free_blocks(reversed(seqs.pop(x % len(seqs))))
    elif op == 2:  # a prefix hit revived
        hit = []
        for i in range(x):
            b = pool.get_cached_block((y % 4, i))
            if b is None:
                break
            hit.append(b)
        if hit:
            pool.touch(hit)
            seqs.append(hit)
        return [b.block_id for b in hit]
    elif op == 3:
        return pool.evict_all_cached()
    elif op == 4 and pool.num_free_blocks:  # one block from the head, to the tail or kept
        b = pool.free_queue.popleft()
        if y % 2 and pool.enable_caching:
            pool.free_queue.append(b)
        else:
            b.ref_cnt = 1
            seqs.append([b])
        return b.block_id
    return None


@pytest.mark.parametrize("cls", [BlockPool, ReuseFirstBlockPool])
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("null", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_pool_makes_blocks_when_taken_as_if_made_up_front(cls, caching, null, seed, spill):
    rng = random.Random(seed)
    lazy, eager = twins(cls, caching, null)
    seqs: tuple[list[list], list[list]] = ([], [])
    fewer = False
    for _ in range(300):
        op, x, y = rng.randrange(5), rng.randrange(1, 7), rng.randrange(12)
        assert pool_op(lazy, seqs[0], op, x, y) == pool_op(eager, seqs[1], op, x, y)
        assert state(lazy) == state(eager)
        fewer = fewer or len(lazy.made_blocks) < lazy.num_blocks
    assert fewer
    assert [b.block_id for b in lazy.free_queue] == [b.block_id for b in eager.free_queue]
    assert lazy._unused.left == 0


def manager_op(kv: KVCacheManager, reqs: list[Request], op: int, arg: int) -> object:
    """One operation of a cache manager's (``arg`` picks the request or the size)."""
    live = [r for r in reqs if r.id in kv.tables]
    if op == 0 or not live:  # a request admitted, perhaps with a prefix hit
        r = Request(len(reqs), 0.0, arg, 5)
        r.prefix_id, r.prefix_len = "sys", min(arg, 12)
        reqs.append(r)
        kv.update_hashes(r)
        hit, n = kv.get_computed_blocks(r)
        if not hit:
            return kv.allocate_fresh(r, r.prompt_len, True, 0)
        got = kv.allocate_slots(r, r.prompt_len - n, hit, n)
        return None if got is None else [b.block_id for b in got]
    r = live[arg % len(live)]
    if op == 1:  # a decode crossing into a new block
        return kv.append_block(r)
    if op == 2:  # several boundaries at once, one request twice
        return kv.append_blocks([*live[: 1 + len(live) // 2], r])
    if op == 3:
        kv.free(r)
    else:  # more slots for a running request
        r.num_computed_tokens = len(kv.tables[r.id]) * 4
        got = kv.allocate_slots(r, arg)
        return None if got is None else [b.block_id for b in got]
    return None


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_cache_manager_on_blocks_made_when_taken(caching, seed, spill):
    rng = random.Random(seed)
    lazy = KVCacheManager(60, 4, enable_caching=caching)
    eager = KVCacheManager(60, 4, enable_caching=caching)
    eager.pool.blocks  # noqa: B018 (makes them all)
    reqs: tuple[list[Request], list[Request]] = ([], [])
    fewer = False
    for _ in range(300):
        op, arg = rng.randrange(5), rng.randrange(1, 30)
        assert manager_op(lazy, reqs[0], op, arg) == manager_op(eager, reqs[1], op, arg)
        assert state(lazy.pool) == state(eager.pool)
        assert {k: [b.block_id for b in t] for k, t in lazy.tables.items()} == \
            {k: [b.block_id for b in t] for k, t in eager.tables.items()}
        fewer = fewer or len(lazy.pool.made_blocks) < lazy.pool.num_blocks
    assert fewer


def test_spill_at_the_unused_node_in_the_middle(monkeypatch):
    """Freed blocks without content before the unused blocks, cached ones after them: a
    walk from the head takes the first, then makes unused blocks, then the cached ones."""
    monkeypatch.setattr(free_queue, "SPILL_AT_LEAST", 1)
    pool = ReuseFirstBlockPool(10, 2, null_block=True)
    a = pool.get_new_blocks(4)  # 1-4
    pool.cache_block(a[0], "x")
    pool.free_blocks(reversed(a))  # 4, 3, 2 to the head; 1 (cached) to the tail
    assert order(pool) == [4, 3, 2, 5, 6, 7, 8, 9, 1]
    made = ReuseFirstBlockPool(10, 2, null_block=True)  # the same, then every block made
    b = made.get_new_blocks(4)
    made.cache_block(b[0], "x")
    made.free_blocks(reversed(b))
    assert [x.block_id for x in made.free_queue] == order(made) == order(pool)
    assert len(made.made_blocks) == 10 and made.free_queue._unused_node is None
    assert [b.block_id for b in pool.get_new_blocks(5)] == [4, 3, 2, 5, 6]
    assert len(pool.made_blocks) == 7
    assert [b.block_id for b in pool.get_new_blocks(4)] == [7, 8, 9, 1]
    assert pool._unused.left == 0 and pool.free_queue._unused_node is None
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 0
    pool.check()


@pytest.mark.parametrize("trace", sorted(GOLDEN.glob("*.trace.jsonl")),
                         ids=lambda p: p.name.removesuffix(".trace.jsonl"))
def test_golden_runs_on_pools_made_up_front(trace: Path, monkeypatch):
    """Every golden workload, block tables included, the same on pools made up front."""
    workload = load_workload(GOLDEN / trace.name.replace(".trace.jsonl", ".json"))
    lazy = run_trace(workload, block_tables=True)
    init = ReuseFirstBlockPool.__init__

    def eager_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.blocks  # noqa: B018 (makes them all)

    monkeypatch.setattr(ReuseFirstBlockPool, "__init__", eager_init)
    eager = run_trace(workload, block_tables=True)
    assert lazy[0] == eager[0]
    assert {k: v for k, v in lazy[1].items() if "wall" not in k and k != "ms_per_step"} == \
        {k: v for k, v in eager[1].items() if "wall" not in k and k != "ms_per_step"}
