"""The free queue of a block pool that only ever takes and frees blocks at its head (no SimPy).

See :class:`BlockStack`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from orcasim.kv.block_pool import Block


class BlockStack:
    """The free queue of a pool whose freed blocks all go to the head: a list whose end is
    the head (taking and freeing blocks are list operations, not links).

    A :class:`~orcasim.kv.cache_manager.ReuseFirstBlockPool` without prefix
    caching has no block with content, so it only ever takes blocks from the
    head and puts freed ones back at the head: its queue is a stack. Given the
    same calls, the order is :class:`FreeBlockQueue`'s (``prev_free`` and
    ``next_free`` stay unused).
    """

    __slots__ = ("blocks", "num_free_blocks")

    def __init__(self, blocks: Iterable[Block]) -> None:
        self.blocks: list[Block] = list(blocks)
        self.blocks.reverse()
        self.num_free_blocks = len(self.blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> Block:
        """Remove and return the first (next to evict) block; IndexError if empty."""
        if not self.blocks:
            raise IndexError("no free blocks")
        self.num_free_blocks -= 1
        return self.blocks.pop()

    def popleft_n(self, n: int) -> list[Block]:
        """Remove and return the first ``n`` blocks (the caller checks there are enough)."""
        if n > self.num_free_blocks:
            raise IndexError("no free blocks")
        stack = self.blocks
        k = len(stack) - n
        out = stack[k:]
        del stack[k:]
        out.reverse()
        self.num_free_blocks -= n
        return out

    def remove(self, block: Block) -> None:
        """Remove ``block`` from the queue (ValueError if it is not there)."""
        for i, b in enumerate(self.blocks):
            if b is block:
                del self.blocks[i]
                self.num_free_blocks -= 1
                return
        raise ValueError(f"{block!r} is not in the free queue")

    def append(self, block: Block) -> None:
        """Put ``block`` at the tail (evicted last)."""
        self.blocks.insert(0, block)
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[Block]) -> None:
        """Put ``blocks`` at the head, in their order (``blocks[0]`` is evicted first)."""
        self.blocks.extend(reversed(blocks))
        self.num_free_blocks += len(blocks)

    def free_in_order(self, ordered: Iterable[Block], null: Block | None) -> None:
        """Drop one reference on each block of ``ordered`` (``null`` excepted): those freed go
        to the head in their order (the first is taken first), as far as the blocks go
        before a double free (ValueError)."""
        freed: list[Block] = []
        try:
            for b in ordered:
                if b is null:
                    continue
                rc = b.ref_cnt
                if rc <= 0:
                    raise ValueError(f"double free of {b!r}")
                b.ref_cnt = rc = rc - 1
                if rc == 0:
                    freed.append(b)
        finally:
            self.prepend_n(freed)

    def push_table(self, table: list[Block]) -> None:
        """Free a block table that holds its blocks alone, tail first: each block to the head
        (``table[-1]`` is taken first), its reference count 0."""
        for b in table:
            b.ref_cnt = 0
        self.blocks += table
        self.num_free_blocks += len(table)

    def deal(self, tables: dict[int, list[Block]], reqs: list[Any]) -> None:
        """One block from the head to the table of each request of ``reqs`` in turn (the
        caller checks there are enough), its reference count 1."""
        pop = self.blocks.pop
        for req in reqs:
            b = pop()
            b.ref_cnt = 1
            tables[req.id].append(b)
        self.num_free_blocks -= len(reqs)

    def __iter__(self) -> Iterator[Block]:
        return iter(self.blocks[::-1])
