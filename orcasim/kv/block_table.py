"""Per-sequence block tables on a :class:`~orcasim.kv.block_pool.BlockPool`, with copy-on-write.

A sequence's *block table* lists the physical blocks that hold its tokens, in
order; block ``i`` holds token positions ``[i * block_size, (i + 1) * block_size)``.
:class:`BlockManager` keeps one table per sequence id and is the only thing
that moves references on the pool's blocks for those sequences:

- :meth:`BlockManager.allocate` starts a sequence, reusing cached blocks for
  the leading full blocks whose content hashes are in the prefix cache (a
  *hit*) and taking new blocks for the rest (a *miss* for each hashed block
  that was not found);
- :meth:`BlockManager.append` grows a sequence by some tokens, taking new
  blocks as it crosses block boundaries;
- :meth:`BlockManager.fork` gives a new sequence the same blocks (one more
  reference each): parallel samples and beams share their common prefix;
- the first write into a *shared, partly filled* last block copies it
  (copy-on-write): the writer gets a private copy and drops its reference on
  the shared one. Full blocks are never written again, so they stay shared;
- :meth:`BlockManager.free` drops a sequence's references, tail first, so a
  shared prefix stays cached the longest.

Failure to get blocks is a return value (``False``), and then nothing changes.
Pure data structure: no SimPy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from orcasim.kv.block_pool import Block, BlockPool


class BlockTable:
    """One sequence's blocks and the number of tokens they hold."""

    __slots__ = ("blocks", "num_tokens")

    def __init__(self, blocks: list[Block], num_tokens: int) -> None:
        self.blocks = blocks
        self.num_tokens = num_tokens

    def __len__(self) -> int:
        return len(self.blocks)

    def __repr__(self) -> str:
        return f"BlockTable({[b.block_id for b in self.blocks]}, tokens={self.num_tokens})"


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers."""
    return -(-a // b)


class BlockManager:
    """Block tables of many sequences over one pool, with prefix-cache and copy-on-write counters.

    Attributes:
        num_prefix_hits / num_prefix_misses: hashed prompt blocks found / not
            found in the prefix cache by :meth:`allocate`.
        num_cow_copies: shared, partly filled blocks copied on first write.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.tables: dict[Hashable, BlockTable] = {}
        self.num_prefix_hits = 0
        self.num_prefix_misses = 0
        self.num_cow_copies = 0

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self.tables

    def table(self, seq: Hashable) -> BlockTable:
        """The block table of ``seq`` (KeyError if it holds none)."""
        return self.tables[seq]

    # -- queries ------------------------------------------------------------
    def num_logical_blocks(self) -> int:
        """Blocks the sequences would hold without any sharing (sum of table lengths)."""
        return sum(len(t.blocks) for t in self.tables.values())

    def blocks_to_append(self, seq: Hashable, n: int = 1) -> int:
        """New blocks that appending ``n`` tokens to ``seq`` would take (copies included)."""
        t = self.tables[seq]
        bs = self.block_size
        need = cdiv(t.num_tokens + n, bs) - len(t.blocks)
        if n > 0 and t.num_tokens % bs and t.blocks[-1].ref_cnt > 1:
            need += 1  # the shared, partly filled last block is copied first
        return need

    def cached_prefix(self, block_hashes: Sequence[Hashable]) -> list[Block]:
        """The longest run of leading ``block_hashes`` found in the prefix cache."""
        found = []
        get = self.pool.get_cached_block
        for h in block_hashes:
            b = get(h)
            if b is None:
                break
            found.append(b)
        return found

    # -- operations -----------------------------------------------------------
    def allocate(
        self, seq: Hashable, num_tokens: int, block_hashes: Sequence[Hashable] = ()
    ) -> bool:
        """Give the new sequence ``seq`` blocks for ``num_tokens`` tokens.

        ``block_hashes`` are the content hashes of its leading *full* blocks
        (at most ``num_tokens // block_size`` of them): those found in the
        prefix cache are shared, the others are taken new and registered in
        the cache once allocated. Returns False, changing nothing, when the
        pool has too few free blocks.
        """
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has blocks")
        bs = self.block_size
        if len(block_hashes) > num_tokens // bs:
            raise ValueError("block_hashes may only name full blocks")
        pool = self.pool
        hits = self.cached_prefix(block_hashes) if pool.enable_caching else []
        need = cdiv(num_tokens, bs) - len(hits)
        revived = sum(1 for b in hits if b.ref_cnt == 0)
        if need + revived > pool.num_free_blocks:
            return False
        pool.touch(hits)
        new = pool.get_new_blocks(need)
        assert new is not None
        for h, b in zip(block_hashes[len(hits):], new, strict=False):
            pool.cache_block(b, h)
        self.num_prefix_hits += len(hits)
        self.num_prefix_misses += len(block_hashes) - len(hits)
        self.tables[seq] = BlockTable(hits + new, num_tokens)
        return True

    def append(self, seq: Hashable, n: int = 1) -> bool:
        """Grow ``seq`` by ``n`` tokens; copy its last block first if it is shared and partly full.

        Returns False, changing nothing, when the pool has too few free blocks.
        """
        t = self.tables[seq]
        need = self.blocks_to_append(seq, n)
        pool = self.pool
        if need > pool.num_free_blocks:
            return False
        if need > 0:
            new = pool.get_new_blocks(need)
            assert new is not None
            if n > 0 and t.num_tokens % self.block_size and t.blocks[-1].ref_cnt > 1:
                shared = t.blocks[-1]
                t.blocks[-1] = new.pop()  # the private copy of the partly filled block
                pool.free_blocks([shared])
                self.num_cow_copies += 1
            t.blocks.extend(new)
        t.num_tokens += n
        return True

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """Start ``child`` with ``parent``'s tokens, sharing every block (no copy yet)."""
        if child in self.tables:
            raise ValueError(f"sequence {child!r} already has blocks")
        t = self.tables[parent]
        self.pool.fork(t.blocks)
        self.tables[child] = BlockTable(list(t.blocks), t.num_tokens)

    def free(self, seq: Hashable) -> int:
        """Drop ``seq``'s references (tail first); returns how many blocks became free."""
        t = self.tables.pop(seq)
        before = self.pool.num_free_blocks
        self.pool.free_blocks(reversed(t.blocks))
        return self.pool.num_free_blocks - before

    def cache_full_blocks(self, seq: Hashable, block_hashes: Sequence[Hashable]) -> None:
        """Register the hashes of ``seq``'s full blocks not yet cached (after a prefill)."""
        t = self.tables[seq]
        full = t.num_tokens // self.block_size
        for b, h in zip(t.blocks[:full], block_hashes, strict=False):
            if b.block_hash is None:
                self.pool.cache_block(b, h)

    def check(self) -> None:
        """Assert the invariants (for tests): pool counts, ref counts, table sizes."""
        pool = self.pool
        pool.check()
        owners: dict[int, int] = {}
        for t in self.tables.values():
            assert len(t.blocks) == cdiv(t.num_tokens, self.block_size), "table size != tokens"
            for b in t.blocks:
                owners[b.block_id] = owners.get(b.block_id, 0) + 1
        for b in pool.made_blocks:  # (a block never taken is free)
            if b is not pool.null_block:
                assert b.ref_cnt == owners.get(b.block_id, 0), f"{b!r}: ref count != owners"
        cached_free = sum(1 for b in pool.free_queue.made() if b.block_hash is not None)
        free_plain = pool.num_free_blocks - cached_free
        assert free_plain + len(owners) + cached_free == pool.num_usable_blocks
