"""Block tables: copy-on-write, forks, prefix hits and misses, invariants under random ops."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.kv import BlockPool
from orcasim.kv.block_table import BlockManager


def ids(blocks):
    return [b.block_id for b in blocks]


def test_append_crosses_block_boundaries():
    m = BlockManager(BlockPool(8, 4, enable_caching=False))
    assert m.allocate("a", 5)  # 2 blocks, the second holding 1 token
    assert ids(m.table("a").blocks) == [0, 1]
    assert m.blocks_to_append("a", 3) == 0 and m.append("a", 3)  # fills block 1
    assert m.blocks_to_append("a", 1) == 1 and m.append("a", 1)
    assert ids(m.table("a").blocks) == [0, 1, 2] and m.table("a").num_tokens == 9
    assert not m.append("a", 100)  # would need 25 more blocks: nothing changes
    assert m.table("a").num_tokens == 9 and m.pool.num_free_blocks == 5
    m.check()


def test_fork_shares_then_first_write_copies_the_partial_block():
    m = BlockManager(BlockPool(8, 4, enable_caching=False))
    m.allocate("p", 6)  # block 0 full, block 1 half full
    m.fork("p", "c")
    assert ids(m.table("c").blocks) == [0, 1]
    assert [b.ref_cnt for b in m.table("p").blocks] == [2, 2]
    assert m.pool.num_held_blocks == 2 and m.num_logical_blocks() == 4
    # the child writes first: it copies block 1 into a new block; block 0 stays shared
    assert m.blocks_to_append("c", 1) == 1
    assert m.append("c", 1)
    assert ids(m.table("c").blocks) == [0, 2] and m.num_cow_copies == 1
    assert [b.ref_cnt for b in m.table("p").blocks] == [2, 1]
    # the parent is now the only owner of block 1 and writes in place
    assert m.blocks_to_append("p", 1) == 0 and m.append("p", 1)
    assert ids(m.table("p").blocks) == [0, 1] and m.num_cow_copies == 1
    # a full shared block is never copied: appending starts a new block
    m.append("p", 1)
    m.fork("p", "d")  # p and d share blocks 0 and 1, both full
    assert m.blocks_to_append("d", 1) == 1
    m.append("d", 1)
    assert ids(m.table("d").blocks) == [0, 1, 3] and m.num_cow_copies == 1
    m.check()
    assert m.free("d") == 1  # only its private block becomes free
    assert m.free("p") == 1 and m.free("c") == 2
    assert m.pool.num_free_blocks == 8
    m.check()


def test_copy_on_write_with_crossing_takes_both_blocks_or_none():
    m = BlockManager(BlockPool(4, 4, enable_caching=False))
    m.allocate("p", 3)
    m.fork("p", "c")
    m.allocate("x", 8)  # 2 blocks; 1 left free
    # c writes 3 tokens: copy of block 0 plus a new block for the 5th token -> 2 blocks, 1 free
    assert m.blocks_to_append("c", 3) == 2
    assert not m.append("c", 3)
    assert m.num_cow_copies == 0 and m.table("c").num_tokens == 3
    m.free("x")
    assert m.append("c", 3) and m.num_cow_copies == 1
    assert len(m.table("c").blocks) == 2 and m.table("p").blocks[0].ref_cnt == 1
    m.check()


def test_prefix_hits_and_misses_and_revival():
    m = BlockManager(BlockPool(6, 4))
    assert m.allocate("a", 10, block_hashes=["h0", "h1"])  # 2 full blocks cached, 1 partial
    assert (m.num_prefix_hits, m.num_prefix_misses) == (0, 2)
    assert m.allocate("b", 9, block_hashes=["h0", "hX"])  # shares block 0 only
    assert (m.num_prefix_hits, m.num_prefix_misses) == (1, 3)
    assert m.table("b").blocks[0] is m.table("a").blocks[0]
    assert m.table("a").blocks[0].ref_cnt == 2
    m.free("a")
    m.free("b")
    assert m.pool.num_free_blocks == 6
    # a third request finds both of a's cached blocks in the free queue and revives them
    assert m.allocate("c", 8, block_hashes=["h0", "h1"])
    assert (m.num_prefix_hits, m.num_prefix_misses) == (3, 3)
    assert m.pool.num_free_blocks == 4
    m.check()


def test_allocation_that_does_not_fit_changes_nothing():
    m = BlockManager(BlockPool(3, 2))
    m.allocate("a", 4, block_hashes=["x", "y"])
    m.free("a")  # two cached free blocks
    assert not m.allocate("b", 8, block_hashes=["x", "y"])  # needs 2 revived + 2 new > 3
    assert (m.num_prefix_hits, m.num_prefix_misses) == (0, 2)
    assert m.pool.num_free_blocks == 3 and "b" not in m
    m.check()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 12), st.integers(0, 3)),
        st.tuples(st.just("append"), st.integers(0, 30), st.integers(1, 6)),
        st.tuples(st.just("fork"), st.integers(0, 30), st.integers(0, 0)),
        st.tuples(st.just("free"), st.integers(0, 30), st.integers(0, 0)),
        st.tuples(st.just("evict"), st.integers(0, 0), st.integers(0, 0)),
    ),
    max_size=50,
)


@settings(max_examples=250, deadline=None)
@given(OPS, st.booleans())
def test_random_operations_keep_the_invariants(ops, caching):
    """free + held + cached-free == pool size; ref counts == owning tables; tables fit tokens."""
    m = BlockManager(BlockPool(10, 3, enable_caching=caching))
    pool = m.pool
    seqs: list[str] = []
    n = 0
    for op, x, y in ops:
        free_before = pool.num_free_blocks
        if op == "allocate":
            hashes = [("c", y, i) for i in range(x // 3)]  # content y: prefix-shaped
            ok = m.allocate(f"s{n}", x, block_hashes=hashes)
            if ok:
                seqs.append(f"s{n}")
                n += 1
            else:
                assert pool.num_free_blocks == free_before
        elif op == "append" and seqs:
            s = seqs[x % len(seqs)]
            need = m.blocks_to_append(s, y)
            tokens = m.table(s).num_tokens
            if m.append(s, y):
                assert pool.num_free_blocks == free_before - need
                assert m.table(s).blocks[-1].ref_cnt == 1  # the writer owns its last block
            else:
                assert need > free_before and m.table(s).num_tokens == tokens
        elif op == "fork" and seqs:
            m.fork(seqs[x % len(seqs)], f"s{n}")
            seqs.append(f"s{n}")
            n += 1
            assert pool.num_free_blocks == free_before
        elif op == "free" and seqs:
            m.free(seqs.pop(x % len(seqs)))
        elif op == "evict":
            pool.evict_all_cached()
        m.check()  # free + held + cached-free == size, ref counts == owners
        assert pool.num_held_blocks <= m.num_logical_blocks()
    for s in seqs:
        m.free(s)
    assert pool.num_free_blocks == pool.num_usable_blocks
    m.check()
