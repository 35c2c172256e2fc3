"""Blocks and the free queue of a block pool; blocks are made when first taken (no SimPy).

See :class:`FreeBlockQueue` and :class:`UnusedBlocks`. The pool itself is
:class:`~orcasim.kv.block_pool.BlockPool`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

#: unused blocks made at once at least, in their place in the queue (a call for each block
#: would cost more than the block)
SPILL_AT_LEAST = 16


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


class UnusedBlocks:
    """The blocks of a pool that were never taken, ids ``next_id`` to ``num_blocks - 1``,
    made only when first taken.

    A pool starts with all its blocks free, in id order, and takes blocks from
    the head of its free queue, so the blocks never taken are one run of the
    queue, in id order, and they are made in id order: :attr:`blocks` lists
    the blocks made so far, each at its id. A run that never fills its pool
    never makes the blocks it does not use.
    """

    __slots__ = ("blocks", "next_id", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.blocks: list[Block] = []
        self.next_id = 0
        self.num_blocks = num_blocks

    @property
    def left(self) -> int:
        """Blocks not made yet."""
        return self.num_blocks - self.next_id

    def take(self, n: int) -> list[Block]:
        """Make the next ``n`` blocks (the caller checks that many are left)."""
        i = self.next_id
        self.next_id = j = i + n
        new = list(map(Block, range(i, j)))  # (no comprehension frame)
        self.blocks += new
        return new


class FreeBlockQueue:
    """Doubly linked list of free blocks, threaded through ``Block.prev_free/next_free``.

    The blocks never taken (:class:`UnusedBlocks`) are one node of the list,
    ``_unused_node``, standing for all of them in its place, until the last
    one is made: a caller walking the list from the head that reaches it calls
    :meth:`spill` for the blocks it takes there. Iterating makes them all.
    """

    __slots__ = ("_head", "_tail", "_unused", "_unused_node", "num_free_blocks")

    def __init__(self, blocks: Iterable[Block], unused: UnusedBlocks | None = None) -> None:
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
        self._unused = unused
        self._unused_node: Block | None = None
        if unused is not None and unused.left:  # the blocks not made yet, after the others
            node = self._unused_node = Block(-3)
            prev.next_free = node
            node.prev_free = prev
            prev = node
            n += unused.left
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free_blocks = n

    def __len__(self) -> int:
        return self.num_free_blocks

    def spill(self, k: int) -> Block:
        """Make the next ``k`` unused blocks, or :data:`SPILL_AT_LEAST` if more (all that
        are left, if fewer), in the place of the unused node, before it (or instead of it,
        once none is left), and return the first.

        The first one's ``prev_free`` is the node before the unused node, whose
        ``next_free`` is left as it was: the caller, at the unused node while
        walking from the head, takes the new blocks out of the list or links them.
        """
        node = self._unused_node
        unused = self._unused
        if k < SPILL_AT_LEAST:
            k = SPILL_AT_LEAST
        before = node.prev_free  # type: ignore[union-attr]
        was = before.next_free  # type: ignore[union-attr]
        if k >= unused.left:  # type: ignore[union-attr]  # the last ones: the node leaves
            k = unused.left  # type: ignore[union-attr]
            after = node.next_free  # type: ignore[union-attr]
            node.prev_free = node.next_free = None  # type: ignore[union-attr]
            self._unused_node = None
        else:
            after = node
        new = unused.take(k)  # type: ignore[union-attr]
        prev = before
        for b in new:
            prev.next_free = b  # type: ignore[union-attr]
            b.prev_free = prev
            prev = b
        prev.next_free = after  # type: ignore[union-attr]
        after.prev_free = prev  # type: ignore[union-attr]
        before.next_free = was  # type: ignore[union-attr]
        return new[0]

    def make_all(self) -> None:
        """Make every block not made yet, in its place in the queue."""
        if self._unused_node is not None:
            first = self.spill(self._unused.left)  # type: ignore[union-attr]
            first.prev_free.next_free = first  # type: ignore[union-attr]

    def popleft(self) -> Block:
        """Remove and return the first (next to evict) block; IndexError if empty."""
        b = self._head.next_free
        if b is self._tail or b is None:
            raise IndexError("no free blocks")
        if b is self._unused_node:
            b = self.spill(1)
        self._unlink(b)
        return b

    def popleft_n(self, n: int) -> list[Block]:
        """Remove and return the first ``n`` blocks (the caller checks there are enough)."""
        if n > self.num_free_blocks:
            raise IndexError("no free blocks")
        head = self._head
        unused = self._unused_node
        out = []
        b = head.next_free
        for i in range(n):
            if b is unused:
                b = self.spill(n - i)
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

    def made(self) -> Iterator[Block]:
        """The free blocks made so far, head first (those never taken left out)."""
        b = self._head.next_free
        while b is not None and b is not self._tail:
            if b is not self._unused_node:
                yield b
            b = b.next_free

    def __iter__(self) -> Iterator[Block]:
        self.make_all()
        return self.made()
