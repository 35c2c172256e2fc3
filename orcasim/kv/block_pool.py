"""A PagedAttention block pool: fixed-size blocks, reference counts, a free queue, a prefix cache.

The pool owns the physical blocks. Callers (a cache manager, a policy) keep
each sequence's block table and decide *which* blocks to take and free; the
pool keeps the counts and the order.

- A block with ``ref_cnt == 0`` sits in the :class:`FreeBlockQueue`, a doubly
  linked list threaded through the blocks: O(1) append, pop from the head and
  removal from the middle, no allocation. Free order is eviction order: new
  blocks are taken from the head, freed blocks go to the tail.
- A full block may carry a content hash and be registered in the prefix
  cache. Freeing it keeps the hash, so it can be *revived* by a later request
  with the same prefix (:meth:`BlockPool.touch` removes it from the middle of
  the queue). It loses the hash only when it is reused for new content
  (eviction happens as it leaves the head of the queue), so cached blocks are
  evicted least recently freed first.
- Allocation failure is a return value (``None``), never an exception.
- A block object is made when the block is first taken
  (:class:`~orcasim.kv.free_queue.UnusedBlocks`): the blocks never taken
  stand as one node of the free queue, in their place, so the order is that
  of a pool that made them all up front, and a run that uses a few blocks of
  a large pool pays for those few.
- Optionally block 0 is a reserved *null block* that is never allocated or
  freed (vLLM V1's placeholder).

Invariant: ``num_free_blocks + num_held_blocks (+ 1 null block) == num_blocks``,
where held blocks are those with ``ref_cnt > 0``; cached-free blocks are
counted among the free ones (:meth:`BlockPool.check`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from orcasim.kv.free_queue import Block, FreeBlockQueue, UnusedBlocks

__all__ = ["Block", "BlockPool", "FreeBlockQueue", "UnusedBlocks"]


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens, with optional prefix caching."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        enable_caching: bool = True,
        null_block: bool = False,
    ) -> None:
        if num_blocks < (2 if null_block else 1):
            raise ValueError('"num_blocks" must be > 0 (and > 1 with a null block).')
        if block_size < 1:
            raise ValueError('"block_size" must be > 0.')
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        # blocks are made as they are first taken (the free queue takes them from here)
        self._unused = UnusedBlocks(num_blocks)
        self.free_queue = self._new_free_queue(self._unused)
        self.null_block: Block | None = self.free_queue.popleft() if null_block else None
        # content hash -> {block id: block}; lookups return the first cached.
        # Identical content computed twice stays in two blocks (block tables
        # are append-only), and either can be hit until it is evicted.
        self.cached: dict[Hashable, dict[int, Block]] = {}
        self.num_evictions = 0
        #: changes whenever the free queue or the prefix cache does (a caller may keep what
        #: it computed from them, such as a refused allocation, while it stays the same)
        self.version = 0

    def _new_free_queue(self, unused: UnusedBlocks) -> FreeBlockQueue:
        """The free queue of a new pool: every block, in id order, none made yet."""
        return FreeBlockQueue((), unused)

    # -- queries ------------------------------------------------------------
    @property
    def blocks(self) -> list[Block]:
        """Every block, at its id (those never taken are made now, in their place)."""
        self.free_queue.make_all()
        return self._unused.blocks

    @property
    def made_blocks(self) -> list[Block]:
        """The blocks made so far, at their ids: every block that was ever taken (a block
        that was not is free, with no content)."""
        return self._unused.blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now, including cached-but-unreferenced ones."""
        return self.free_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be allocated (the null block excluded)."""
        return self.num_blocks - (1 if self.null_block is not None else 0)

    @property
    def num_held_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_usable_blocks - self.free_queue.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Distinct contents in the prefix cache (held or free)."""
        return len(self.cached)

    def usage(self) -> float:
        """Share of usable blocks held by sequences."""
        return self.num_held_blocks / self.num_usable_blocks

    def get_cached_block(self, block_hash: Hashable) -> Block | None:
        """The first cached block with ``block_hash``, or None."""
        blocks = self.cached.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    # -- operations -----------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[Block] | None:
        """Take ``n`` blocks from the head of the free queue (evicting their cache entries).

        Returns None, and changes nothing, when fewer than ``n`` are free.
        """
        queue = self.free_queue
        if n > queue.num_free_blocks:
            return None
        self.version += 1
        out = queue.popleft_n(n)
        if not self.enable_caching:  # no block holds content
            for b in out:
                b.ref_cnt = 1
            return out
        evict = self._evict
        for b in out:
            if b.block_hash is not None:
                evict(b)
            b.ref_cnt = 1
        return out

    def _evict(self, b: Block) -> None:
        blocks = self.cached.get(b.block_hash)
        if blocks is not None and blocks.pop(b.block_id, None) is not None:
            self.num_evictions += 1
            if not blocks:
                del self.cached[b.block_hash]
        b.block_hash = None

    def cache_block(self, block: Block, block_hash: Hashable) -> None:
        """Mark a full, held ``block`` as holding content ``block_hash``.

        If another block already caches that content both stay cached;
        lookups return the one cached first.
        """
        if not self.enable_caching:
            return
        if block.block_hash is not None:
            raise ValueError(f"{block!r} already has a hash")
        self.version += 1
        block.block_hash = block_hash
        self.cached.setdefault(block_hash, {})[block.block_id] = block

    def cache_blocks(self, blocks: list[Block], block_hashes: list[Hashable], start: int,
                     end: int) -> None:
        """:meth:`cache_block` of ``blocks[i]`` with ``block_hashes[i]`` for each ``i`` from
        ``start`` to ``end`` in turn (a request's blocks filled since the last call)."""
        if not self.enable_caching or start >= end:
            return
        self.version += end - start
        cached = self.cached
        for i in range(start, end):
            block = blocks[i]
            if block.block_hash is not None:
                raise ValueError(f"{block!r} already has a hash")
            h = block_hashes[i]
            block.block_hash = h
            found = cached.get(h)
            if found is None:
                cached[h] = {block.block_id: block}
            else:
                found[block.block_id] = block

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on blocks found in the cache (reviving free ones)."""
        queue = self.free_queue
        null = self.null_block
        self.version += 1
        for b in blocks:
            if b.ref_cnt == 0 and b is not null:
                queue.remove(b)
            b.ref_cnt += 1

    def fork(self, blocks: Iterable[Block]) -> None:
        """Share ``blocks`` with another sequence (copy-on-write): one more reference each."""
        for b in blocks:
            if b.ref_cnt <= 0:
                raise ValueError(f"cannot share free {b!r}")
            b.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue in this order.

        The first block given is evicted first, so callers free a sequence's
        blocks tail first to keep its shared prefix cached the longest.
        """
        append = self.free_queue.append
        self.version += 1
        for b in self.drop_refs(ordered):
            append(b)

    def drop_refs(self, ordered: Iterable[Block]) -> list[Block]:
        """Drop one reference on each block (the null block excepted); return those now free.

        The caller puts the returned blocks into the free queue; subclasses
        choose where (see :meth:`free_blocks`).
        """
        null = self.null_block
        freed = []
        for b in ordered:
            if b is null:
                continue
            if b.ref_cnt <= 0:
                raise ValueError(f"double free of {b!r}")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                freed.append(b)
        return freed

    def evict_all_cached(self) -> int:
        """Forget every cached hash held by a free block; returns how many were dropped."""
        n = 0
        self.version += 1
        for b in self.free_queue.made():  # (a block never taken has no content)
            if b.block_hash is not None:
                self._evict(b)
                n += 1
        return n

    def check(self) -> None:
        """Assert the pool's invariants (for tests): counts add up, the queue is consistent."""
        queue = self.free_queue
        free = list(queue.made())  # (without making the blocks never taken)
        unused = self._unused
        assert len(free) + unused.left == queue.num_free_blocks, "free count drifted"
        assert all(b.ref_cnt == 0 for b in free), "a referenced block is in the free queue"
        assert len({b.block_id for b in free}) == len(free), "a block is queued twice"
        assert all(b.block_id == i for i, b in enumerate(unused.blocks)), "blocks out of order"
        held = [b for b in unused.blocks if b.ref_cnt > 0 and b is not self.null_block]
        assert len(free) + unused.left + len(held) == self.num_usable_blocks, \
            "free + held != pool size"
        for h, blocks in self.cached.items():
            assert blocks, "empty cache entry"
            for bid, b in blocks.items():
                assert b.block_id == bid and b.block_hash == h, "cache entry with other content"
