"""Per-request KV memory for running requests: paged blocks or contiguous reservations.

Both allocators answer the same questions for a policy, in token *slots*
(``capacity`` = blocks x block size):

- can this request ever run (:meth:`need` vs :attr:`capacity_units`), and
  does it fit now (:meth:`admit` returns False, changing nothing, if not)?
- hold memory for a running request's tokens (:meth:`allocate_tokens`:
  paged, up to the blocks its tokens need; a reservation covers the request's
  whole life); a decode batch's growth is counted in bulk by
  :class:`~orcasim.sched.decode_growth.DecodeGrowth`;
- :meth:`release` its memory when it finishes or is preempted.

They also keep the aggregates that the KV usage series integrates over time:
``allocated_slots`` (held by requests), ``internal_slots`` (allocated slots
the owner will never fill: the unused tail of a paged request's final block,
or a reservation's excess over the request's footprint) and
``padding_slots`` (taken beyond the reservation by a buddy allocator's
rounding: lost to everyone, external fragmentation). The remaining allocated
slots not holding tokens are *reserved*: the owner fills them later.

The simulator knows each request's true output length, so it knows the
footprint; a real system does not, and only ``oracle`` uses it to decide.
Pure data structures: no SimPy.
"""

from __future__ import annotations

from orcasim.kv.block_pool import Block
from orcasim.kv.block_table import cdiv
from orcasim.kv.config import MemoryLayout, footprint, reservation
from orcasim.kv.contiguous import BuddySpace, ContiguousSpace
from orcasim.request import Request


class PagedAllocator:
    """PagedAttention: a request holds ``ceil(tokens / block_size)`` blocks, taken on demand.

    Requests in a decode batch never share blocks and nothing is looked up
    by content, so any free block serves any request: the allocator keeps
    exact *counts* (blocks per request, free blocks) and every operation is
    O(1). Block identities, sharing, copy-on-write and prefix caching live
    in :class:`~orcasim.kv.block_table.BlockManager` for the policies that
    need them.
    """

    paged = True

    def __init__(self, layout: MemoryLayout) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self.capacity = layout.num_blocks * layout.block_size
        self.capacity_units = layout.num_blocks  # what need() is measured in
        self.num_free_blocks = layout.num_blocks
        self.internal_slots = 0
        self.padding_slots = 0
        self.held: dict[int, int] = {}  # request id -> blocks
        self._internal: dict[int, int] = {}  # request id -> its final block's unused tail

    @property
    def allocated_slots(self) -> int:
        return (self.layout.num_blocks - self.num_free_blocks) * self.block_size

    @property
    def free_units(self) -> int:
        return self.num_free_blocks

    def need(self, req: Request) -> int:
        """Blocks ``req`` needs to run its next step (prompt and generated tokens so far)."""
        p = req.prompt_len
        return -(-((p if p > 0 else 1) + req.num_output_tokens) // self.block_size)

    def held_blocks(self, req: Request) -> int:
        return self.held[req.id]

    def admit(self, req: Request, keep_free: int = 0) -> bool:
        """Allocate blocks for ``req``'s known tokens if ``keep_free`` blocks stay free after."""
        rid = req.id
        held = self.held
        if rid in held:
            raise ValueError(f"request {req.label} already holds blocks")
        p = req.prompt_len
        if p < 1:
            p = 1
        bs = self.block_size
        n = -(-(p + req.num_output_tokens) // bs)  # need(req)
        if n + keep_free > self.num_free_blocks:
            return False
        self.num_free_blocks -= n
        held[rid] = n
        tail = n * bs - (p + req.output_len - 1)  # as _note_final
        if tail >= 0:
            self._internal[rid] = tail
            self.internal_slots += tail
        return True

    def allocate_tokens(self, req: Request, num_tokens: int, keep_free: int = 0) -> bool:
        """Hold blocks for ``num_tokens`` tokens of ``req`` (all or nothing); False if short.

        A request that holds none yet must leave ``keep_free`` blocks free
        (the watermark); one that grows takes any free block.
        """
        n = -(-(num_tokens if num_tokens > 0 else 1) // self.block_size)
        held = self.held.get(req.id)
        if held is None:
            if n + keep_free > self.num_free_blocks:
                return False
        elif n <= held:
            return True
        elif n - held > self.num_free_blocks:
            return False
        self.num_free_blocks -= n - (held or 0)
        self.held[req.id] = n
        self._note_final(req, n)
        return True

    def holds(self, req: Request) -> bool:
        return req.id in self.held

    def _note_final(self, req: Request, n: int) -> None:
        slots = n * self.block_size
        p = req.prompt_len
        fp = (p if p > 0 else 1) + req.output_len - 1
        if slots >= fp:  # its final block: the tail beyond the footprint is never filled
            self._internal[req.id] = slots - fp
            self.internal_slots += slots - fp

    def release(self, req: Request) -> int:
        """Free ``req``'s blocks; returns the number freed."""
        self.internal_slots -= self._internal.pop(req.id, 0)
        n = self.held.pop(req.id)
        self.num_free_blocks += n
        return n

    # blocking gets of blocks not owned by any request (KVPool.get)
    def take_blocks(self, n: int) -> int | None:
        if n > self.num_free_blocks:
            return None
        self.num_free_blocks -= n
        return n

    def put_blocks(self, n: int) -> None:
        if n < 0 or self.num_free_blocks + n > self.layout.num_blocks:
            raise ValueError(f"cannot return {n} blocks: only "
                             f"{self.layout.num_blocks - self.num_free_blocks} are taken")
        self.num_free_blocks += n


class ReservationAllocator:
    """Contiguous reservation per request (``max``, ``pow2`` or ``oracle``), first fit."""

    paged = False

    def __init__(self, layout: MemoryLayout) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        space = BuddySpace if layout.placement == "buddy" else ContiguousSpace
        self.space: ContiguousSpace | BuddySpace = space(layout.capacity_tokens)
        self.capacity = layout.capacity_tokens
        self.capacity_units = self.capacity
        self.internal_slots = 0
        self.padding_slots = 0
        self._waste: dict[int, tuple[int, int]] = {}  # request id -> (internal, padding)

    @property
    def allocated_slots(self) -> int:
        return self.capacity - self.space.num_free

    @property
    def free_units(self) -> int:
        return self.space.num_free

    def need(self, req: Request) -> int:
        """Slots ``req`` takes: its reservation (rounded to a power of two by a buddy space)."""
        size = reservation(self.layout, req.prompt_len, req.output_len)
        return BuddySpace.chunk_size(size) if self.layout.placement == "buddy" else size

    def held_blocks(self, req: Request) -> int:
        return cdiv(self.space.regions[req.id][1], self.block_size)

    def admit(self, req: Request, keep_free: int = 0) -> bool:
        """Reserve ``req``'s region at the first hole that fits (``keep_free`` is ignored)."""
        size = reservation(self.layout, req.prompt_len, req.output_len)
        if self.space.reserve(req.id, size) is None:
            return False
        internal = size - footprint(req.prompt_len, req.output_len)
        padding = self.space.regions[req.id][1] - size
        self._waste[req.id] = (internal, padding)
        self.internal_slots += internal
        self.padding_slots += padding
        return True

    def allocate_tokens(self, req: Request, num_tokens: int, keep_free: int = 0) -> bool:
        """Reserve ``req``'s region if it holds none (it covers every token); False if no hole."""
        return req.id in self.space.regions or self.admit(req)

    def holds(self, req: Request) -> bool:
        return req.id in self.space.regions

    def release(self, req: Request) -> int:
        internal, padding = self._waste.pop(req.id)
        self.internal_slots -= internal
        self.padding_slots -= padding
        return self.space.release(req.id)

    def take_blocks(self, n: int) -> int | None:
        raise ValueError("blocks can only be taken from a paged pool")

    def put_blocks(self, n: int) -> None:
        raise ValueError("blocks can only be returned to a paged pool")


class BlockPoolAllocator:
    """Paged memory kept as block objects (a :class:`ReuseFirstBlockPool`: identities, ref
    counts, prefix cache), for a policy whose cache manager allocates them (``vllm-v1``).

    The pool's blocks are the engine's KV memory: the read-outs, ``kv.get``
    and the memory series count them. Requests' blocks come and go through
    the policy's :class:`~orcasim.kv.cache_manager.KVCacheManager` on
    :attr:`block_pool`, so the per-request operations are the manager's.
    """

    paged = True

    def __init__(self, layout: MemoryLayout, enable_caching: bool = True) -> None:
        from orcasim.kv.cache_manager import ReuseFirstBlockPool

        self.layout = layout
        self.block_size = layout.block_size
        # one more block: vLLM's null block, never allocated
        self.block_pool = ReuseFirstBlockPool(layout.num_blocks + 1, layout.block_size,
                                              enable_caching=enable_caching, null_block=True)
        self.capacity = layout.num_blocks * layout.block_size
        self.capacity_units = layout.num_blocks
        self.internal_slots = 0
        self.padding_slots = 0
        self._taken: list[Block] = []  # blocks taken with take_blocks, oldest first

    @property
    def allocated_slots(self) -> int:
        return self.block_pool.num_held_blocks * self.block_size

    @property
    def free_units(self) -> int:
        """Free blocks, cached ones that no request holds included (they are evictable)."""
        return self.block_pool.num_free_blocks

    def holds(self, req: Request) -> bool:
        return False  # the cache manager keeps the block tables

    def take_blocks(self, n: int) -> int | None:
        got = self.block_pool.get_new_blocks(n)
        if got is None:
            return None
        self._taken.extend(got)
        return n

    def put_blocks(self, n: int) -> None:
        if n < 0 or n > len(self._taken):
            raise ValueError(f"cannot return {n} blocks: only {len(self._taken)} are taken")
        back, self._taken = self._taken[len(self._taken) - n:], self._taken[:len(self._taken) - n]
        self.block_pool.free_blocks(back)


def make_allocator(layout: MemoryLayout) -> PagedAllocator | ReservationAllocator:
    """The allocator named by ``layout.allocator``."""
    if layout.allocator == "paged":
        return PagedAllocator(layout)
    return ReservationAllocator(layout)
