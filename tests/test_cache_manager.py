"""KVCacheManager: prefix-hit cap, allocation as a value, vLLM's free-queue rules, caching."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.kv.cache_manager import KVCacheManager, ReuseFirstBlockPool
from orcasim.request import Request


def req(rid, prompt, output=4, prefix=None, computed=0):
    r = Request(rid, 0.0, prompt, output)
    if prefix is not None:
        r.prefix_id, r.prefix_len = prefix
    r.num_computed_tokens = computed
    return r


def ids(blocks):
    return [b.block_id for b in blocks]


def test_freed_blocks_without_content_are_reused_first_cached_ones_last():
    pool = ReuseFirstBlockPool(8, 4, null_block=True)
    a = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_block(a[0], "x")
    pool.cache_block(a[1], "y")
    pool.free_blocks(reversed(a))  # 3 has no content: head; then 2, 1 at the tail
    assert ids(pool.free_queue) == [3, 4, 5, 6, 7, 2, 1]
    # a new allocation takes the uncached blocks first; cached 2 is evicted before 1
    assert ids(pool.get_new_blocks(6)) == [3, 4, 5, 6, 7, 2]
    assert pool.get_cached_block("y") is None and pool.get_cached_block("x") is a[0]
    pool.check()


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(32, 4)
    x = req(0, 18, prefix=("S", 12))
    kv.update_hashes(x)
    assert kv.allocate_slots(x, 18) is not None  # 4 full blocks cached at once
    assert kv.num_cached_blocks == 4
    # the same 12-token system prompt: 3 blocks cached, but the last token must be computed
    z = req(1, 12, prefix=("S", 12))
    kv.update_hashes(z)
    hit, num_hit = kv.get_computed_blocks(z)
    assert num_hit == 8 and ids(hit) == ids(kv.tables[0][:2])
    # one more token of its own: the whole shared prompt hits
    w = req(2, 13, prefix=("S", 12))
    kv.update_hashes(w)
    assert kv.get_computed_blocks(w)[1] == 12
    # other content after the prefix: no hit past it
    v = req(3, 30, prefix=("S", 6))
    kv.update_hashes(v)
    assert kv.get_computed_blocks(v)[1] == 4


def test_allocation_failure_is_a_value_and_changes_nothing():
    kv = KVCacheManager(6, 4)  # 5 usable blocks
    a = req(0, 12)
    kv.update_hashes(a)
    assert len(kv.allocate_slots(a, 12)) == 3
    b = req(1, 12)
    kv.update_hashes(b)
    before = (kv.num_free_blocks, kv.num_cached_blocks, list(ids(kv.pool.free_queue)))
    assert kv.allocate_slots(b, 12) is None
    assert kv.allocate_slots(b, 4, watermark_blocks=2) is None  # 1 block + 2 kept free > 2
    assert kv.allocate_slots(b, 4, full_sequence_must_fit=True) is None  # needs 3 blocks
    assert (kv.num_free_blocks, kv.num_cached_blocks, list(ids(kv.pool.free_queue))) == before
    assert b.id not in kv.tables
    assert ids(kv.allocate_slots(b, 4)) == [4]  # a first chunk fits without the gate


def test_hit_blocks_in_the_free_queue_count_against_the_free_blocks():
    kv = KVCacheManager(5, 4)  # 4 usable
    a = req(0, 9, prefix=("S", 8))
    kv.update_hashes(a)
    kv.allocate_slots(a, 9)
    kv.free(a)  # 3 blocks free, 2 of them cached
    b = req(1, 16, prefix=("S", 8))
    kv.update_hashes(b)
    hit, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    # 2 new blocks + the 2 free hit blocks = 4 <= 4 free
    assert kv.num_blocks_to_allocate(b, 16, hit) == 4
    assert kv.allocate_slots(b, 8, hit, num_hit) is not None
    assert kv.block_ids(b)[:2] == ids(hit) and kv.num_free_blocks == 0
    kv.pool.check()


def test_generated_tokens_are_shared_content():
    kv = KVCacheManager(32, 4)
    a, b = req(0, 6, prefix=("S", 6)), req(1, 6, prefix=("S", 6))
    for r in (a, b):
        r.num_output_tokens = 6  # 12 known tokens, the same for both
        kv.update_hashes(r)
    assert kv.hashes[0] == kv.hashes[1] and len(kv.hashes[0]) == 3


def test_caching_off_never_hits():
    kv = KVCacheManager(16, 4, enable_caching=False)
    a = req(0, 8, prefix=("S", 8))
    kv.update_hashes(a)
    kv.allocate_slots(a, 8)
    b = req(1, 9, prefix=("S", 8))
    kv.update_hashes(b)
    assert kv.get_computed_blocks(b) == ([], 0) and kv.num_cached_blocks == 0


OPS = st.lists(st.tuples(st.sampled_from(["alloc", "free", "hit"]), st.integers(0, 30),
                         st.integers(1, 6)), max_size=60)


@settings(max_examples=200)
@given(OPS, st.booleans())
def test_random_tables_keep_the_pool_invariants(ops, caching):
    """Counts add up; a freed table's blocks without content go to the head of the free queue
    and its cached blocks to the tail, tail block first in both."""
    kv = KVCacheManager(16, 4, enable_caching=caching)
    live: dict[int, Request] = {}
    for op, x, y in ops:
        if op in ("alloc", "hit"):
            r = req(len(live) + 1000 * x, 4 * y + x % 4, prefix=("S", 8) if op == "hit" else None)
            if r.id in live:
                continue
            kv.update_hashes(r)
            hit, num_hit = kv.get_computed_blocks(r)
            if kv.allocate_slots(r, r.num_tokens - num_hit, hit, num_hit) is not None:
                live[r.id] = r
        elif live:
            r = live.pop(sorted(live)[x % len(live)])
            held = kv.tables[r.id]
            kv.free(r)
            queue = list(kv.pool.free_queue)
            freed_now = [b for b in held if b.ref_cnt == 0]
            plain = [queue.index(b) for b in freed_now if b.block_hash is None]
            cached = [queue.index(b) for b in freed_now if b.block_hash is not None]
            assert plain == list(range(len(plain)))[::-1]  # at the head, tail block first
            assert cached == sorted(cached, reverse=True) and all(
                i >= len(queue) - len(cached) for i in cached)  # at the tail, head block last
        kv.pool.check()
        held_blocks = {b.block_id for t in kv.tables.values() for b in t}
        assert kv.num_free_blocks + len(held_blocks) == kv.pool.num_usable_blocks


def test_appending_blocks_at_once_takes_them_as_one_by_one():
    """append_blocks (a decode run's boundaries) equals append_block in turn: the same block
    ids from the head of the free queue, cached free blocks evicted in the same order."""
    def setup():
        kv = KVCacheManager(12, 4)
        a, b = req(0, 8), req(1, 4)
        for r in (a, b):
            kv.update_hashes(r)
            assert kv.allocate_slots(r, r.prompt_len) is not None
        c = req(2, 8)  # its two cached blocks go to the tail of the free queue when freed
        kv.update_hashes(c)
        assert kv.allocate_slots(c, 8) is not None
        kv.free(c)
        return kv, a, b

    one, a1, b1 = setup()
    for r in (a1, b1, a1, b1, b1, a1, b1, a1):  # 8: every free block, c's cached ones last
        assert one.append_block(r)
    many, a2, b2 = setup()
    assert many.append_blocks([a2, b2, a2, b2, b2, a2, b2, a2])
    assert many.block_ids(a2) == one.block_ids(a1) and many.block_ids(b2) == one.block_ids(b1)
    assert ids(many.pool.free_queue) == ids(one.pool.free_queue)
    assert many.pool.num_evictions == one.pool.num_evictions == 2  # c's two cached blocks
    assert {h: ids(bl.values()) for h, bl in many.pool.cached.items()} == \
        {h: ids(bl.values()) for h, bl in one.pool.cached.items()}
    assert len(many.pool.cached) == 3  # a's two full blocks and b's one
    # more than are free (none is): nothing changes
    assert not many.append_blocks([a2])
    assert len(many.tables[0]) == 6 and len(many.tables[1]) == 5
    many.pool.check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.booleans(),
                          st.integers(0, 3), st.booleans()), min_size=1, max_size=12),
       st.integers(1, 8), st.booleans())
def test_allocate_fresh_is_allocate_slots_for_a_request_without_blocks_or_hit(
        reqs, block_size, caching):
    # twin managers: one admits with allocate_slots, the other with allocate_fresh; answers,
    # tables, the free queue and the prefix cache stay the same (some requests finish)
    twins = [KVCacheManager(24, block_size, enable_caching=caching, max_model_len=60)
             for _ in range(2)]
    for i, (prompt, chunk, reserve, watermark, done) in enumerate(reqs):
        got = []
        for k, kv in enumerate(twins):
            r = req(i, prompt, prefix=("S", min(prompt, 8)))
            kv.update_hashes(r)
            n = min(chunk, prompt)
            if k == 0:
                got.append(kv.allocate_slots(r, n, full_sequence_must_fit=reserve,
                                             watermark_blocks=watermark) is not None)
            else:
                got.append(kv.allocate_fresh(r, n, reserve, watermark))
            if got[-1] and done:
                kv.free(r)
        assert got[0] == got[1]
        a, b = twins
        assert {k: ids(t) for k, t in a.tables.items()} == {k: ids(t) for k, t in b.tables.items()}
        assert ids(a.pool.free_queue) == ids(b.pool.free_queue)
        assert a.num_cached == b.num_cached and a.pool.cached.keys() == b.pool.cached.keys()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 30), st.integers(0, 50)), max_size=40))
def test_freeing_a_table_without_caching_equals_the_checked_free(ops):
    """Without prefix caching a table's blocks are its own: free_table (the manager's free
    then) links them in as free_blocks does, the same free queue and counts."""
    fast = KVCacheManager(40, 4, enable_caching=False)
    slow = KVCacheManager(40, 4, enable_caching=False)
    slow.pool.free_table = lambda table: slow.pool.free_blocks(reversed(table))  # checked
    live: list[int] = []
    for k, (alloc, tokens, pick) in enumerate(ops):
        if alloc or not live:
            got = [kv.allocate_slots(req(k, tokens), tokens) is not None for kv in (fast, slow)]
            assert got[0] == got[1]
            if got[0]:
                live.append(k)
        else:
            rid = live.pop(pick % len(live))
            for kv in (fast, slow):
                kv.free(req(rid, 1))
        assert ids(fast.pool.free_queue) == ids(slow.pool.free_queue)
        assert fast.pool.version == slow.pool.version
        assert all(b.ref_cnt == 0 for b in fast.pool.free_queue)
        fast.pool.check()
    for b_fast, b_slow in zip(fast.pool.blocks, slow.pool.blocks, strict=True):
        assert b_fast.ref_cnt == b_slow.ref_cnt
