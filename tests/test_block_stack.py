"""BlockStack: the free queue of a pool without prefix caching takes and frees blocks in the
order of the linked FreeBlockQueue, through every cache-manager and pool operation."""

from __future__ import annotations

import random

import pytest

from orcasim.kv.block_pool import FreeBlockQueue
from orcasim.kv.block_stack import BlockStack
from orcasim.kv.cache_manager import KVCacheManager, ReuseFirstBlockPool
from orcasim.request import Request


def _managers() -> tuple[KVCacheManager, KVCacheManager]:
    """Two managers without prefix caching: one on the stack, one on the linked queue."""
    fast = KVCacheManager(40, 4, enable_caching=False)
    slow = KVCacheManager(40, 4, enable_caching=False)
    assert type(fast.pool.free_queue) is BlockStack
    slow.pool.free_queue = FreeBlockQueue(list(slow.pool.free_queue))  # type: ignore[assignment]
    return fast, slow


def _state(kv: KVCacheManager) -> tuple[object, ...]:
    queue = kv.pool.free_queue
    kv.pool.check()
    return ([b.block_id for b in queue], queue.num_free_blocks, len(queue),
            {rid: [b.block_id for b in t] for rid, t in kv.tables.items()},
            [b.ref_cnt for b in kv.pool.blocks], kv.pool.version)


def _apply(kv: KVCacheManager, reqs: list[Request], op: int, arg: int) -> object:
    """One operation on ``kv`` (``arg`` picks the request or the size)."""
    live = [r for r in reqs if r.id in kv.tables]
    if op == 0:  # admit a fresh request
        r = Request(len(reqs), 0.0, arg, 5)
        reqs.append(r)
        return kv.allocate_fresh(r, r.prompt_len, True, 0)
    if not live:
        return None
    r = live[arg % len(live)]
    if op == 1:  # a decode crossing into a new block
        return kv.append_block(r)
    if op == 2:  # several boundaries at once, one request twice
        return kv.append_blocks([*live[: 1 + len(live) // 2], r])
    if op == 3:  # a request leaves
        kv.free(r)
    elif op == 4:  # its blocks freed through the pool, tail first
        kv.pool.free_blocks(reversed(kv.tables.pop(r.id)))
    else:  # more slots for a running request
        r.num_computed_tokens = len(kv.tables[r.id]) * 4
        got = kv.allocate_slots(r, arg)
        return None if got is None else [b.block_id for b in got]
    return None


@pytest.mark.parametrize("seed", range(8))
def test_stack_takes_and_frees_as_the_linked_queue(seed: int) -> None:
    rng = random.Random(seed)
    fast, slow = _managers()
    fast_reqs: list[Request] = []
    slow_reqs: list[Request] = []
    for _ in range(400):
        op, arg = rng.randrange(6), rng.randrange(1, 30)
        assert _apply(fast, fast_reqs, op, arg) == _apply(slow, slow_reqs, op, arg)
        assert _state(fast) == _state(slow)


def test_stack_queue_operations() -> None:
    pool = ReuseFirstBlockPool(8, 4, enable_caching=False, null_block=True)
    queue = pool.free_queue
    assert type(queue) is BlockStack
    assert [b.block_id for b in queue] == [1, 2, 3, 4, 5, 6, 7]
    a = pool.get_new_blocks(3)
    assert [b.block_id for b in a] == [1, 2, 3] and all(b.ref_cnt == 1 for b in a)
    pool.free_blocks(reversed(a))  # tail first: 3 ends up taken first
    assert [b.block_id for b in queue] == [3, 2, 1, 4, 5, 6, 7]
    with pytest.raises(ValueError):
        pool.free_blocks([a[0]])  # double free
    b = queue.popleft()
    queue.append(b)
    assert [x.block_id for x in queue] == [2, 1, 4, 5, 6, 7, 3]
    queue.remove(pool.blocks[4])
    assert [x.block_id for x in queue] == [2, 1, 5, 6, 7, 3] and len(queue) == 6
    with pytest.raises(ValueError):
        queue.remove(pool.blocks[4])
    with pytest.raises(IndexError):
        queue.popleft_n(7)
    queue.prepend_n([pool.blocks[4]])
    assert [x.block_id for x in queue][:2] == [4, 2]
