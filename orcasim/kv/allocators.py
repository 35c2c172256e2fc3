"""Per-request KV memory for running requests: paged blocks or contiguous reservations.

Both allocators answer the same questions for a policy, in token *slots*
(``capacity`` = blocks x block size):

- can this request ever run (:meth:`need` vs :attr:`capacity_units`), and
  does it fit now (:meth:`admit` returns False, changing nothing, if not)?
- grow a running request by one block (:meth:`grow`, paged only; a
  reservation covers the request's whole life);
- :meth:`release` its memory when it finishes or is preempted.

They also keep the aggregates that the KV usage series integrates over time:
``allocated_slots`` (held by requests), ``internal_slots`` (allocated slots
the owner will never fill: the unused tail of a paged request's final block,
or a reservation's excess over the request's footprint). The remaining
allocated slots not holding tokens are *reserved*: the owner fills them later.

The simulator knows each request's true output length, so it knows the
footprint; a real system does not, and only ``oracle`` uses it to decide.
Pure data structures: no SimPy.
"""

from __future__ import annotations

from orcasim.kv.block_pool import Block, BlockPool
from orcasim.kv.block_table import BlockManager, cdiv
from orcasim.kv.config import MemoryLayout, footprint, reservation
from orcasim.kv.contiguous import ContiguousSpace
from orcasim.request import Request


class PagedAllocator:
    """PagedAttention: a request holds ``ceil(tokens / block_size)`` blocks, taken on demand."""

    paged = True

    def __init__(self, layout: MemoryLayout) -> None:
        self.layout = layout
        self.block_size = bs = layout.block_size
        self.pool = BlockPool(layout.num_blocks, bs, enable_caching=False)
        self.manager = BlockManager(self.pool)
        self.capacity = layout.num_blocks * bs
        self.capacity_units = layout.num_blocks  # what need() is measured in
        self.internal_slots = 0
        self._internal: dict[int, int] = {}  # request id -> its final block's unused tail

    @property
    def allocated_slots(self) -> int:
        return self.pool.num_held_blocks * self.block_size

    @property
    def free_units(self) -> int:
        return self.pool.num_free_blocks

    def need(self, req: Request) -> int:
        """Blocks ``req`` needs to run its next step (prompt and generated tokens so far)."""
        return cdiv(max(req.prompt_len, 1) + req.num_output_tokens, self.block_size)

    def held_blocks(self, req: Request) -> int:
        return len(self.manager.tables[req.id].blocks)

    def held_slots(self, req: Request) -> int:
        return len(self.manager.tables[req.id].blocks) * self.block_size

    def admit(self, req: Request, keep_free: int = 0) -> bool:
        """Allocate blocks for ``req``'s known tokens if ``keep_free`` blocks stay free after."""
        tokens = max(req.prompt_len, 1) + req.num_output_tokens
        if cdiv(tokens, self.block_size) + keep_free > self.pool.num_free_blocks:
            return False
        ok = self.manager.allocate(req.id, tokens)
        assert ok
        self._note_final(req)
        return True

    def grow(self, req: Request, num_tokens: int) -> bool:
        """Extend ``req``'s table to ``num_tokens`` known tokens (one more block); False if none."""
        t = self.manager.tables[req.id]
        if not self.manager.append(req.id, num_tokens - t.num_tokens):
            return False
        self._note_final(req)
        return True

    def _note_final(self, req: Request) -> None:
        held = len(self.manager.tables[req.id].blocks) * self.block_size
        fp = footprint(req.prompt_len, req.output_len)
        if held >= fp and req.id not in self._internal:
            self._internal[req.id] = held - fp
            self.internal_slots += held - fp

    def release(self, req: Request) -> int:
        """Free ``req``'s blocks; returns the number freed."""
        self.internal_slots -= self._internal.pop(req.id, 0)
        return self.manager.free(req.id)

    # blocking gets of raw blocks (KVPool.get); not owned by any request
    def take_blocks(self, n: int) -> list[Block] | None:
        return self.pool.get_new_blocks(n)

    def put_blocks(self, blocks: list[Block]) -> None:
        self.pool.free_blocks(blocks)


class ReservationAllocator:
    """Contiguous reservation per request (``max``, ``pow2`` or ``oracle``), first fit."""

    paged = False

    def __init__(self, layout: MemoryLayout) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self.space = ContiguousSpace(layout.capacity_tokens)
        self.capacity = layout.capacity_tokens
        self.capacity_units = self.capacity
        self.internal_slots = 0
        self._internal: dict[int, int] = {}

    @property
    def allocated_slots(self) -> int:
        return self.capacity - self.space.num_free

    @property
    def free_units(self) -> int:
        return self.space.num_free

    def need(self, req: Request) -> int:
        """Slots reserved for ``req``."""
        return reservation(self.layout, req.prompt_len, req.output_len)

    def held_blocks(self, req: Request) -> int:
        return cdiv(self.space.regions[req.id][1], self.block_size)

    def held_slots(self, req: Request) -> int:
        return self.space.regions[req.id][1]

    def admit(self, req: Request, keep_free: int = 0) -> bool:
        """Reserve ``req``'s region at the first hole that fits (``keep_free`` is ignored)."""
        size = self.need(req)
        if self.space.reserve(req.id, size) is None:
            return False
        waste = size - footprint(req.prompt_len, req.output_len)
        self._internal[req.id] = waste
        self.internal_slots += waste
        return True

    def grow(self, req: Request, num_tokens: int) -> bool:
        raise ValueError("a reservation never grows")

    def release(self, req: Request) -> int:
        self.internal_slots -= self._internal.pop(req.id)
        return self.space.release(req.id)

    def take_blocks(self, n: int) -> list[Block] | None:
        raise ValueError("blocks can only be taken from a paged pool")

    def put_blocks(self, blocks: list[Block]) -> None:
        raise ValueError("blocks can only be returned to a paged pool")


def make_allocator(layout: MemoryLayout) -> PagedAllocator | ReservationAllocator:
    """The allocator named by ``layout.allocator``."""
    if layout.allocator == "paged":
        return PagedAllocator(layout)
    return ReservationAllocator(layout)
