"""BlockPool: counts, free-queue order, prefix cache revival and eviction, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.kv import BlockHasher, BlockPool


def ids(blocks):
    return [b.block_id for b in blocks]


def test_allocate_free_order_and_null_block():
    pool = BlockPool(6, 4, null_block=True)
    assert pool.num_free_blocks == 5 and pool.null_block.block_id == 0
    a = pool.get_new_blocks(3)
    assert ids(a) == [1, 2, 3]
    assert pool.get_new_blocks(3) is None  # failure is a value, and changes nothing
    assert pool.num_free_blocks == 2
    pool.free_blocks(reversed(a))  # tail first: block 3 will be evicted first
    assert ids(pool.free_queue) == [4, 5, 3, 2, 1]
    pool.check()


def test_prefix_cache_revive_and_lru_eviction():
    pool = BlockPool(4, 2)
    h = BlockHasher()
    hashes = h.chain(["p0", "p1"])
    a = pool.get_new_blocks(2)
    for blk, hsh in zip(a, hashes, strict=True):
        pool.cache_block(blk, hsh)
    pool.free_blocks(reversed(a))
    assert pool.num_cached_blocks == 2 and pool.num_free_blocks == 4
    # a second request with the same prefix revives both from the middle of the queue
    hit = [pool.get_cached_block(x) for x in h.chain(["p0", "p1"])]
    assert ids(hit) == ids(a)
    pool.touch(hit)
    assert pool.num_free_blocks == 2 and all(b.ref_cnt == 1 for b in hit)
    pool.free_blocks(reversed(hit))
    # new allocations take uncached blocks first, then evict the least recently freed
    new = pool.get_new_blocks(3)
    assert ids(new) == [2, 3, ids(a)[1]]
    assert pool.get_cached_block(hashes[1]) is None and pool.get_cached_block(hashes[0]) is a[0]
    assert pool.num_evictions == 1
    pool.check()


def test_duplicate_content_stays_cached_in_both_blocks():
    pool = BlockPool(4, 2)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, 7)
    pool.cache_block(b, 7)
    assert pool.num_cached_blocks == 1 and pool.get_cached_block(7) is a
    pool.free_blocks([a, b])
    pool.get_new_blocks(3)  # takes the two never-used blocks, then evicts a
    assert pool.get_cached_block(7) is b
    pool.check()


def test_chained_hashes_depend_on_the_prefix():
    h = BlockHasher()
    assert h.chain(["x", "y"]) == h.chain(["x", "y"])
    assert h.chain(["x", "y"])[1] != h.chain(["z", "y"])[1]


def test_double_free_and_sharing_free_blocks_are_errors():
    pool = BlockPool(3, 1)
    (a,) = pool.get_new_blocks(1)
    pool.free_blocks([a])
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([a])
    with pytest.raises(ValueError, match="cannot share"):
        pool.fork([a])


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 5), st.integers(0, 3)),
        st.tuples(st.just("free"), st.integers(0, 20), st.integers(0, 0)),
        st.tuples(st.just("fork"), st.integers(0, 20), st.integers(0, 0)),
        st.tuples(st.just("hit"), st.integers(0, 3), st.integers(1, 5)),
        st.tuples(st.just("evict"), st.integers(0, 0), st.integers(0, 0)),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(OPS, st.booleans())
def test_random_operations_keep_the_invariants(ops, null):
    """free + held == pool size, ref counts equal the number of owning sequences."""
    pool = BlockPool(12, 4, null_block=null)
    seqs: list[list] = []
    for op, x, y in ops:
        if op == "alloc":
            blocks = pool.get_new_blocks(x)
            if blocks is None:
                assert x > pool.num_free_blocks
                continue
            for i, b in enumerate(blocks):  # content y: prefix-shaped hashes
                pool.cache_block(b, (y, i))
            seqs.append(blocks)
        elif op == "free" and seqs:
            pool.free_blocks(reversed(seqs.pop(x % len(seqs))))
        elif op == "fork" and seqs:
            s = seqs[x % len(seqs)]
            pool.fork(s)
            seqs.append(list(s))
        elif op == "hit":
            found = []
            for i in range(y):
                b = pool.get_cached_block((x, i))
                if b is None:
                    break
                found.append(b)
            if found:
                pool.touch(found)
                seqs.append(found)
        elif op == "evict":
            pool.evict_all_cached()
        pool.check()
        owners: dict[int, int] = {}
        for s in seqs:
            for b in s:
                owners[b.block_id] = owners.get(b.block_id, 0) + 1
        for b in pool.blocks:
            if b is not pool.null_block:
                assert b.ref_cnt == owners.get(b.block_id, 0)
    for s in seqs:
        pool.free_blocks(reversed(s))
    assert pool.num_free_blocks == pool.num_usable_blocks
    pool.check()


def test_block_content_keys():
    from orcasim.kv import block_content
    from orcasim.request import Request

    a = Request(1, 0.0, 40, 8)
    a.prefix_id, a.prefix_len = "sys", 20
    b = Request(2, 0.0, 40, 8)
    b.prefix_id, b.prefix_len = "sys", 24
    # blocks fully inside both prefixes match; the one straddling a's prefix end does not
    assert block_content(a, 8, 0) == block_content(b, 8, 0) == (("p", "sys", 0, 8),)
    assert block_content(a, 8, 1) == block_content(b, 8, 1)
    assert block_content(a, 8, 2) == (("p", "sys", 16, 20), ("u", 1, 20, 24))
    assert block_content(a, 8, 2) != block_content(b, 8, 2)
    # generated tokens: unique, or shared with a stub model's constant token
    assert block_content(a, 8, 5) == (("o", 1, 40, 48),)
    assert block_content(a, 8, 5, shared_output=True) == (("o", 8),)
    # Mooncake-style hash ids of 16-token blocks, the last one partial
    c = Request(3, 0.0, 36, 4)
    c.hash_ids, c.hash_block_size = [11, 12, 13], 16
    assert block_content(c, 8, 1) == (("h", 11, 8, 16),)
    assert block_content(c, 8, 4) == (("h", 13, 0, 4), ("o", 3, 36, 40))


def test_cache_blocks_and_append_n_are_their_single_block_calls_in_turn():
    """BlockPool.cache_blocks (a run of a table's blocks) and FreeBlockQueue.append_n equal
    cache_block and append of each block in turn: the same cache, order, queue, version."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        one, many = BlockPool(12, 2), BlockPool(12, 2)
        taken = int(rng.integers(1, 11))
        a, b = one.get_new_blocks(taken), many.get_new_blocks(taken)
        hashes = [int(h) for h in rng.integers(0, 4, taken)]  # repeats: content cached twice
        start = int(rng.integers(0, taken))
        end = int(rng.integers(start, taken + 1))
        for i in range(start, end):
            one.cache_block(a[i], hashes[i])
        many.cache_blocks(b, hashes, start, end)
        assert one.version == many.version
        assert {h: ids(d.values()) for h, d in one.cached.items()} == \
            {h: ids(d.values()) for h, d in many.cached.items()}
        assert list(one.cached) == list(many.cached)
        k = int(rng.integers(0, taken + 1))
        for blk in a[:k]:
            blk.ref_cnt = 0
            one.free_queue.append(blk)
        for blk in b[:k]:
            blk.ref_cnt = 0
        many.free_queue.append_n(b[:k])
        assert ids(one.free_queue) == ids(many.free_queue)
        assert len(one.free_queue) == len(many.free_queue)
        one.check()
        many.check()
    pool = BlockPool(4, 2)
    (blk,) = pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="already has a hash"):
        pool.cache_blocks([blk, blk], [1, 2], 0, 2)
