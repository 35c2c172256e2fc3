"""Per-request block tables over a block pool, with vLLM V1's allocation rules (no SimPy).

The three layers of vLLM's V1 core, as in orcasim: a scheduler decides who
runs and how many tokens each gets; this cache manager keeps each request's
block table and its prefix-cache hashes; the :class:`~orcasim.kv.block_pool.BlockPool`
owns the physical blocks, the free queue and the hash map.

The rules reproduced here (vLLM 0.33.0, one full-attention KV group):

- A request's *hashes* cover its full blocks of known tokens (prompt plus
  generated), chained over the prefix; they grow as tokens are generated and
  survive a preemption.
- A prefix-cache lookup walks the hashes from the first block and stops at the
  first miss, never covering the last known token: at least one token is
  recomputed to produce logits, so a hit is at most ``(num_tokens - 1) //
  block_size`` blocks.
- :meth:`KVCacheManager.allocate_slots` gives a request slots for the tokens it
  computes this step, or returns ``None`` (changing nothing) when the free
  blocks, minus a watermark, do not cover the new blocks plus the cache hits
  it would take out of the free queue. Admission can require the whole known
  sequence to fit (vLLM's ``scheduler_reserve_full_isl``).
- Blocks become cached as soon as their tokens are scheduled and known, so a
  request admitted later in the same step can hit them.
- A request's blocks are freed tail first. Freed blocks without content go to
  the *head* of the free queue (reused first); cached blocks go to the tail, so
  the least recently freed cached block is evicted first
  (:class:`ReuseFirstBlockPool`).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from orcasim.kv.block_pool import Block, BlockPool, FreeBlockQueue, UnusedBlocks
from orcasim.kv.block_stack import BlockStack
from orcasim.kv.block_table import cdiv
from orcasim.kv.hashing import BlockHasher, unique_block_id


class ReuseFirstBlockPool(BlockPool):
    """A block pool whose freed blocks without cached content are reused first (vLLM V1).

    vLLM puts a freed block that holds no prefix-cache entry at the head of the free queue
    (it will never be hit, and reusing it first keeps cached blocks alive longer) and a
    cached one at the tail, where it waits to be evicted least recently freed first.
    Without prefix caching, the free queue is a :class:`~orcasim.kv.block_stack.BlockStack`.
    """

    def _new_free_queue(self, unused: UnusedBlocks) -> FreeBlockQueue:
        if not self.enable_caching:
            return BlockStack((), unused)  # type: ignore[return-value]
        return FreeBlockQueue((), unused)

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        # as drop_refs, then the freed blocks without content linked in at the head (in
        # their order, as prepend_n) on the way, those with content appended after
        null = self.null_block
        queue = self.free_queue
        self.version += 1
        if type(queue) is BlockStack:
            queue.free_in_order(ordered, null)
            return
        prev = queue._head
        first = prev.next_free
        num_plain = 0
        cached: list[Block] = []
        try:
            for b in ordered:
                if b is null:
                    continue
                rc = b.ref_cnt
                if rc <= 0:
                    raise ValueError(f"double free of {b!r}")
                b.ref_cnt = rc = rc - 1
                if rc == 0:
                    if b.block_hash is None:
                        prev.next_free = b
                        b.prev_free = prev
                        prev = b
                        num_plain += 1
                    else:
                        cached.append(b)
        finally:  # the queue stays whole, with the blocks freed so far
            prev.next_free = first
            first.prev_free = prev  # type: ignore[union-attr]
            queue.num_free_blocks += num_plain
            if cached:
                queue.append_n(cached)

    def free_table(self, table: list[Block]) -> None:
        """:meth:`free_blocks` of ``reversed(table)`` for a table that holds its blocks alone
        and has none cached or null (a cache manager without prefix caching, where blocks
        are never shared): each block goes to the head of the free queue, tail first, as
        there, without the per-block checks."""
        queue = self.free_queue
        self.version += 1
        if type(queue) is BlockStack:
            queue.push_table(table)
            return
        prev = head = queue._head
        first = head.next_free
        for b in reversed(table):
            b.ref_cnt = 0
            prev.next_free = b
            b.prev_free = prev
            prev = b
        prev.next_free = first
        first.prev_free = prev  # type: ignore[union-attr]
        queue.num_free_blocks += len(table)


class KVCacheManager:
    """Block tables and prefix-cache hashes of the requests of one engine.

    Requests are duck-typed (:class:`~orcasim.request.Request`): ``id`` keys the
    tables, ``num_tokens`` is the count of known tokens, ``num_computed_tokens``
    the tokens already computed, and the content attributes read by
    :func:`~orcasim.kv.hashing.block_content` describe the tokens. Generated
    tokens are shared content (a stub model that always samples the same token),
    as in the vLLM harness the policy is checked against.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        max_model_len: int = 1 << 62,
        pool: ReuseFirstBlockPool | None = None,
    ) -> None:
        if pool is None:
            pool = ReuseFirstBlockPool(num_blocks, block_size, enable_caching=enable_caching,
                                       null_block=True)
        self.pool = pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.hasher = BlockHasher()
        self.tables: dict[int, list[Block]] = {}
        self.hashes: dict[int, list[int]] = {}
        # blocks at the start of a table already registered in the prefix cache
        self.num_cached: dict[int, int] = {}

    # -- queries -----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Free blocks, including cached ones that no request holds (evictable)."""
        return self.pool.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Entries in the prefix-cache hash map."""
        return self.pool.num_cached_blocks

    def block_ids(self, req: Any) -> list[int]:
        """The request's block table as block ids."""
        return [b.block_id for b in self.tables.get(req.id, ())]

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks holding ``num_tokens`` tokens."""
        return cdiv(num_tokens, self.block_size)

    # -- hashes --------------------------------------------------------------------
    def update_hashes(self, req: Any) -> None:
        """Hash the request's newly completed blocks of known tokens (after arrival or a token)."""
        if not self.enable_caching:
            return
        bs = self.block_size
        hashes = self.hashes.get(req.id)
        if hashes is None:
            hashes = self.hashes[req.id] = []
        num_full = req.num_tokens // bs
        if len(hashes) >= num_full:
            return
        parent = hashes[-1] if hashes else 0
        i = len(hashes)
        if parent >= 0:  # shareable so far: interned until the request's own tokens start
            block_id = self.hasher.request_block_id
            while i < num_full and parent >= 0:
                parent = block_id(parent, req, i, bs)
                hashes.append(parent)
                i += 1
        if i < num_full:  # unique from here on: named by (request, index)
            hashes.extend(range(unique_block_id(req.id, i), unique_block_id(req.id, num_full),
                                -1))

    def forget(self, req: Any) -> None:
        """Drop a finished request's hashes (its blocks must be freed already)."""
        self.hashes.pop(req.id, None)

    # -- the prefix cache -------------------------------------------------------------
    def get_computed_blocks(self, req: Any) -> tuple[list[Block], int]:
        """The longest run of cached blocks from the start, and the tokens it covers.

        The hit never covers the last known token (it is recomputed to sample
        the next one), so it is at most ``(num_tokens - 1) // block_size`` blocks.
        """
        if not self.enable_caching:
            return [], 0
        hashes = self.hashes.get(req.id)
        if not hashes:
            return [], 0
        cached = self.pool.cached  # as pool.get_cached_block: the first block cached
        hit: list[Block] = []
        for h in islice(hashes, (req.num_tokens - 1) // self.block_size):
            blocks = cached.get(h)
            if not blocks:
                break
            hit.append(next(iter(blocks.values())))
        return hit, len(hit) * self.block_size

    # -- allocation ---------------------------------------------------------------------
    def num_blocks_to_allocate(self, req: Any, num_tokens: int, hit: list[Block]) -> int:
        """Free blocks that giving ``req`` slots for ``num_tokens`` tokens would consume.

        New blocks beyond the table and the hit, plus the hit blocks that sit in
        the free queue (taking them removes them from it).
        """
        table = self.tables.get(req.id)
        held = len(table) if table is not None else 0
        new = max(cdiv(num_tokens, self.block_size) - held - len(hit), 0)
        return new + sum(1 for b in hit if b.ref_cnt == 0)

    def allocate_slots(
        self,
        req: Any,
        num_new_tokens: int,
        hit: list[Block] | None = None,
        num_hit_tokens: int = 0,
        *,
        full_sequence_must_fit: bool = False,
        watermark_blocks: int = 0,
    ) -> list[Block] | None:
        """Slots for ``num_new_tokens`` more tokens of ``req`` (after its prefix hit, if any).

        Returns the newly allocated blocks, or ``None`` without changing
        anything when ``watermark_blocks`` plus the blocks needed exceed the free
        blocks. With ``full_sequence_must_fit`` the request's whole known
        sequence must fit first (an admission gate). On success the hit blocks
        join the table, and every full block of known tokens up to the end of
        this step's chunk is registered in the prefix cache.
        """
        max_len = self.max_model_len  # (min and max of two written out: a call costs more)
        computed = req.num_computed_tokens + num_hit_tokens
        if computed > max_len:
            computed = max_len
        num_slots = computed + num_new_tokens
        if num_slots > max_len:
            num_slots = max_len
        rid = req.id
        bs = self.block_size
        pool = self.pool
        table = self.tables.get(rid)
        if not hit and not full_sequence_must_fit and table is not None:
            # a running request: only blocks past its table, no hit to take
            num_new_blocks = (num_slots + bs - 1) // bs - len(table)
            if ((num_new_blocks if num_new_blocks > 0 else 0) + watermark_blocks
                    > pool.free_queue.num_free_blocks):
                return None
        else:
            hit = hit or []
            free = pool.free_queue.num_free_blocks
            held = len(table) if table is not None else 0
            # hit blocks in the free queue leave it when taken
            revived = sum(1 for b in hit if b.ref_cnt == 0) if hit else 0
            if full_sequence_must_fit:
                full = req.num_tokens
                if full > max_len:
                    full = max_len
                if (max((full + bs - 1) // bs - held - len(hit), 0) + revived
                        + watermark_blocks > free):
                    return None
            if max((num_slots + bs - 1) // bs - held - len(hit), 0) + revived \
                    + watermark_blocks > free:
                return None
            if table is None:
                table = self.tables[rid] = []
            if hit:
                pool.touch(hit)
                table.extend(hit)
                self.num_cached[rid] = len(table)
            num_new_blocks = (num_slots + bs - 1) // bs - len(table)
        new: list[Block] = []
        if num_new_blocks > 0:
            new = pool.get_new_blocks(num_new_blocks)  # type: ignore[assignment]
            table.extend(new)
        if self.enable_caching:
            m = computed + num_new_tokens
            known = req.num_tokens
            if m > known:
                m = known
            if m // bs > self.num_cached.get(rid, 0):
                self.cache_blocks(req, m)
        return new

    def allocate_fresh(self, req: Any, num_new_tokens: int, full_sequence_must_fit: bool,
                       watermark_blocks: int) -> bool:
        """:meth:`allocate_slots` for a request with no blocks and no prefix hit (an admission
        that hit nothing): its first blocks, or False changing nothing."""
        bs = self.block_size
        max_len = self.max_model_len
        free = self.pool.free_queue.num_free_blocks - watermark_blocks
        known = req.num_tokens
        if full_sequence_must_fit and ((known if known < max_len else max_len) + bs - 1) // bs \
                > free:
            return False
        computed = req.num_computed_tokens
        if computed > max_len:
            computed = max_len
        m = computed + num_new_tokens
        need = ((m if m < max_len else max_len) + bs - 1) // bs
        if need > free:
            return False
        self.tables[req.id] = self.pool.get_new_blocks(need) if need > 0 else []
        if self.enable_caching:
            if m > known:
                m = known
            if m // bs > self.num_cached.get(req.id, 0):
                self.cache_blocks(req, m)
        return True

    def append_block(self, req: Any) -> bool:
        """One more block at the end of a running request's table (a decode crossing a block
        boundary); False, changing nothing, when no block is free."""
        pool = self.pool
        queue = pool.free_queue
        if not queue.num_free_blocks:
            return False
        pool.version += 1
        b = queue.popleft()  # as get_new_blocks(1)
        if b.block_hash is not None:
            pool._evict(b)
        b.ref_cnt = 1
        self.tables[req.id].append(b)
        return True

    def append_blocks(self, reqs: list[Any]) -> bool:
        """:meth:`append_block` for each request of ``reqs`` in turn (one may come more than
        once); False, changing nothing, when fewer blocks are free."""
        pool = self.pool
        queue = pool.free_queue
        n = len(reqs)
        if n > queue.num_free_blocks:
            return False
        pool.version += 1
        # pool.get_new_blocks(n) (from the head in order, as one by one), each block going
        # to its table on the way
        tables = self.tables
        if type(queue) is BlockStack:
            queue.deal(tables, reqs)
            return True
        head = queue._head
        unused = queue._unused_node
        b = head.next_free
        for req in reqs:
            if b is unused:  # the blocks never taken: made now, in their place
                b = queue.spill(n)
            tables[req.id].append(b)
            nxt = b.next_free  # type: ignore[union-attr]
            b.prev_free = b.next_free = None  # type: ignore[union-attr]
            if b.block_hash is not None:  # type: ignore[union-attr]
                pool._evict(b)  # type: ignore[arg-type]
            b.ref_cnt = 1  # type: ignore[union-attr]
            b = nxt
        head.next_free = b
        b.prev_free = head  # type: ignore[union-attr]
        queue.num_free_blocks -= n
        return True

    def cache_blocks(self, req: Any, num_tokens: int) -> None:
        """Register the full, hashed blocks among the first ``num_tokens`` tokens in the cache."""
        rid = req.id
        bs = self.block_size
        start = self.num_cached.get(rid, 0)
        if num_tokens // bs <= start:
            return
        hashes = self.hashes.get(rid)
        if not hashes:
            return
        end = min(num_tokens // bs, len(hashes))
        if start >= end:
            return
        self.pool.cache_blocks(self.tables[rid], hashes, start, end)
        self.num_cached[rid] = end

    def free(self, req: Any) -> None:
        """Release the request's blocks, tail first (its prefix stays cached the longest)."""
        rid = req.id
        self.num_cached.pop(rid, None)
        table = self.tables.pop(rid, None)
        if table:
            if self.enable_caching:
                self.pool.free_blocks(reversed(table))
            else:  # its blocks are its own (no prefix hit shares them) and never cached
                self.pool.free_table(table)
