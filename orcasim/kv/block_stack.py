"""The free queue of a block pool that only ever takes and frees blocks at its head (no SimPy).

See :class:`BlockStack`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from orcasim.kv.free_queue import SPILL_AT_LEAST, Block, UnusedBlocks


class BlockStack:
    """The free queue of a pool whose freed blocks all go to the head: a list whose end is
    the head (taking and freeing blocks are list operations, not links).

    A :class:`~orcasim.kv.cache_manager.ReuseFirstBlockPool` without prefix
    caching has no block with content, so it only ever takes blocks from the
    head and puts freed ones back at the head: its queue is a stack. Given the
    same calls, the order is :class:`FreeBlockQueue`'s (``prev_free`` and
    ``next_free`` stay unused). The blocks never taken (``unused``) come after
    those in the list, in id order, and are made as they are taken (all of
    them before a block goes to the tail).
    """

    __slots__ = ("_unused", "blocks", "num_free_blocks")

    def __init__(self, blocks: Iterable[Block], unused: UnusedBlocks | None = None) -> None:
        self.blocks: list[Block] = list(blocks)
        self.blocks.reverse()
        self._unused = unused
        self.num_free_blocks = len(self.blocks) + (unused.left if unused is not None else 0)

    def _fill(self, n: int) -> None:
        """Make unused blocks until the list holds ``n``, :data:`SPILL_AT_LEAST` at least
        (or every block is made)."""
        unused = self._unused
        k = n - len(self.blocks)
        if k > 0 and unused is not None and unused.left:
            if k < SPILL_AT_LEAST:
                k = SPILL_AT_LEAST
            new = unused.take(k if k < unused.left else unused.left)
            new.reverse()
            self.blocks[:0] = new

    def make_all(self) -> None:
        """Make every block not made yet, in its place in the queue."""
        if self._unused is not None:
            self._fill(self.num_free_blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> Block:
        """Remove and return the first (next to evict) block; IndexError if empty."""
        if not self.blocks:
            self._fill(1)
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
        if k < 0:
            self._fill(n)
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
        self.make_all()
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
        if len(reqs) > len(self.blocks):
            self._fill(len(reqs))
        pop = self.blocks.pop
        for req in reqs:
            b = pop()
            b.ref_cnt = 1
            tables[req.id].append(b)
        self.num_free_blocks -= len(reqs)

    def made(self) -> Iterator[Block]:
        """The free blocks made so far, head first (those never taken left out)."""
        return iter(self.blocks[::-1])

    def __iter__(self) -> Iterator[Block]:
        self.make_all()
        return iter(self.blocks[::-1])
