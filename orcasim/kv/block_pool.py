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
- Optionally block 0 is a reserved *null block* that is never allocated or
  freed (vLLM V1's placeholder).

Invariant: ``num_free_blocks + num_held_blocks (+ 1 null block) == num_blocks``,
where held blocks are those with ``ref_cnt > 0``; cached-free blocks are
counted among the free ones (:meth:`BlockPool.check`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator


class Block:
    """One physical KV block."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Hashable | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        h = "" if self.block_hash is None else f", hash={self.block_hash!r}"
        return f"Block({self.block_id}, ref={self.ref_cnt}{h})"


class FreeBlockQueue:
    """Doubly linked list of free blocks, threaded through ``Block.prev_free/next_free``."""

    __slots__ = ("_head", "_tail", "num_free_blocks")

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)  # sentinels
        self._tail = Block(-2)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        prev = self._head
        n = 0
        for b in blocks:  # linked in one pass, as appending each in turn
            prev.next_free = b
            b.prev_free = prev
            prev = b
            n += 1
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free_blocks = n

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> Block:
        """Remove and return the first (next to evict) block; IndexError if empty."""
        b = self._head.next_free
        if b is self._tail or b is None:
            raise IndexError("no free blocks")
        self._unlink(b)
        return b

    def popleft_n(self, n: int) -> list[Block]:
        """Remove and return the first ``n`` blocks (the caller checks there are enough)."""
        if n > self.num_free_blocks:
            raise IndexError("no free blocks")
        head = self._head
        out = []
        b = head.next_free
        for _ in range(n):
            out.append(b)
            nxt = b.next_free  # type: ignore[union-attr]
            b.prev_free = b.next_free = None  # type: ignore[union-attr]
            b = nxt
        head.next_free = b
        b.prev_free = head  # type: ignore[union-attr]
        self.num_free_blocks -= n
        return out  # type: ignore[return-value]

    def remove(self, block: Block) -> None:
        """Remove ``block`` from the middle of the queue in O(1)."""
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"{block!r} is not in the free queue")
        self._unlink(block)

    def _unlink(self, b: Block) -> None:
        prev, nxt = b.prev_free, b.next_free
        prev.next_free = nxt  # type: ignore[union-attr]
        nxt.prev_free = prev  # type: ignore[union-attr]
        b.prev_free = b.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: Block) -> None:
        """Put ``block`` at the tail (evicted last)."""
        last = self._tail.prev_free
        last.next_free = block  # type: ignore[union-attr]
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[Block]) -> None:
        """Put ``blocks`` at the tail in their order (as :meth:`append` of each in turn)."""
        tail = self._tail
        last = tail.prev_free
        for b in blocks:
            last.next_free = b  # type: ignore[union-attr]
            b.prev_free = last
            last = b
        last.next_free = tail  # type: ignore[union-attr]
        tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[Block]) -> None:
        """Put ``blocks`` at the head, in their order (``blocks[0]`` is evicted first)."""
        if not blocks:
            return
        prev = self._head
        first = prev.next_free
        for b in blocks:
            prev.next_free = b
            b.prev_free = prev
            prev = b
        prev.next_free = first
        first.prev_free = prev  # type: ignore[union-attr]
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[Block]:
        b = self._head.next_free
        while b is not None and b is not self._tail:
            yield b
            b = b.next_free


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
        self.blocks = list(map(Block, range(num_blocks)))  # (no comprehension frame)
        self.free_queue = FreeBlockQueue(self.blocks)
        self.null_block: Block | None = self.free_queue.popleft() if null_block else None
        # content hash -> {block id: block}; lookups return the first cached.
        # Identical content computed twice stays in two blocks (block tables
        # are append-only), and either can be hit until it is evicted.
        self.cached: dict[Hashable, dict[int, Block]] = {}
        self.num_evictions = 0
        #: changes whenever the free queue or the prefix cache does (a caller may keep what
        #: it computed from them, such as a refused allocation, while it stays the same)
        self.version = 0

    # -- queries ------------------------------------------------------------
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
        for b in self.free_queue:
            if b.block_hash is not None:
                self._evict(b)
                n += 1
        return n

    def check(self) -> None:
        """Assert the pool's invariants (for tests): counts add up, the queue is consistent."""
        free = list(self.free_queue)
        assert len(free) == self.free_queue.num_free_blocks, "free count drifted"
        assert all(b.ref_cnt == 0 for b in free), "a referenced block is in the free queue"
        assert len({b.block_id for b in free}) == len(free), "a block is queued twice"
        held = [b for b in self.blocks if b.ref_cnt > 0 and b is not self.null_block]
        assert len(free) + len(held) == self.num_usable_blocks, "free + held != pool size"
        for h, blocks in self.cached.items():
            assert blocks, "empty cache entry"
            for bid, b in blocks.items():
                assert b.block_id == bid and b.block_hash == h, "cache entry with other content"
