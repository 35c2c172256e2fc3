"""Contiguous KV spaces (first fit, buddy): the allocators of pre-PagedAttention systems.

Orca and FasterTransformer keep each request's KV cache in one contiguous
region of ``capacity`` token slots, reserved when the request starts and
released when it ends. Regions of different sizes leave *holes* between
them: free memory that a new request may not fit into although the total
free memory would be enough (external fragmentation).

:class:`ContiguousSpace` keeps the holes as a sorted list of ``(start,
length)`` and reserves at the lowest address that fits (first fit), merging
neighbouring holes on release. The number of live regions is the batch size,
so the linear scans are short. :class:`BuddySpace` is a binary buddy
allocator (the vLLM paper assumes one for its Orca baselines): every region
takes an aligned power-of-two chunk. Pure data structures: no SimPy.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable


class ContiguousSpace:
    """``capacity`` slots; :meth:`reserve` a contiguous region per owner, :meth:`release` it."""

    __slots__ = ("_holes", "capacity", "num_free", "regions")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError('"capacity" must be > 0.')
        self.capacity = capacity
        self.num_free = capacity
        self._holes: list[tuple[int, int]] = [(0, capacity)]  # (start, length), by start
        self.regions: dict[Hashable, tuple[int, int]] = {}

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Free ``(start, length)`` runs, lowest address first."""
        return list(self._holes)

    @property
    def largest_hole(self) -> int:
        """Length of the longest free run (0 when full)."""
        return max((n for _, n in self._holes), default=0)

    def fits(self, size: int) -> bool:
        """True if a region of ``size`` slots can be reserved now."""
        return any(n >= size for _, n in self._holes)

    def reserve(self, owner: Hashable, size: int) -> int | None:
        """Reserve ``size`` slots for ``owner`` at the first hole that fits; its start, or None."""
        if owner in self.regions:
            raise ValueError(f"{owner!r} already holds a region")
        if size < 1:
            raise ValueError("a region must have at least one slot")
        holes = self._holes
        for i, (start, n) in enumerate(holes):
            if n >= size:
                if n == size:
                    del holes[i]
                else:
                    holes[i] = (start + size, n - size)
                self.regions[owner] = (start, size)
                self.num_free -= size
                return start
        return None

    def release(self, owner: Hashable) -> int:
        """Free ``owner``'s region, merging it with neighbouring holes; returns its size."""
        start, size = self.regions.pop(owner)
        holes = self._holes
        i = bisect_left(holes, (start, 0))
        end = start + size
        if i < len(holes) and holes[i][0] == end:  # merge with the hole after
            end += holes[i][1]
            del holes[i]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == start:  # and the one before
            start = holes[i - 1][0]
            holes[i - 1] = (start, end - start)
        else:
            holes.insert(i, (start, end - start))
        self.num_free += size
        return size

    def check(self) -> None:
        """Assert the invariants (for tests): regions and holes tile the space exactly."""
        runs = sorted([*self.regions.values(), *self._holes])
        pos = 0
        for start, n in runs:
            assert start == pos and n > 0, f"gap or overlap at {pos}"
            pos += n
        assert pos == self.capacity, "regions and holes do not cover the space"
        for (a, n), (b, _) in zip(self._holes, self._holes[1:], strict=False):
            assert a + n < b, "adjacent holes were not merged"
        assert self.num_free == sum(n for _, n in self._holes)


class BuddySpace:
    """``capacity`` slots managed by a binary buddy allocator.

    A region of ``size`` slots takes a whole aligned chunk of the next power
    of two: the rounding (*padding*) is lost to the owner and to everyone
    else. Freed chunks merge with their free buddy. A capacity that is not a
    power of two is split into top-level chunks of decreasing powers of two
    from address 0, so every chunk is aligned to its size. The lowest free
    chunk of the smallest sufficient order is taken, so runs are deterministic.
    """

    __slots__ = ("_free", "_tops", "capacity", "num_free", "regions")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError('"capacity" must be > 0.')
        self.capacity = capacity
        self.num_free = capacity
        self.regions: dict[Hashable, tuple[int, int]] = {}  # owner -> (start, chunk size)
        self._free: dict[int, set[int]] = {}  # order -> free chunk starts
        self._tops: list[tuple[int, int]] = []  # (start, order) of the top-level chunks
        start = 0
        for order in range(capacity.bit_length() - 1, -1, -1):
            if capacity >> order & 1:
                self._tops.append((start, order))
                self._free.setdefault(order, set()).add(start)
                start += 1 << order

    @staticmethod
    def chunk_size(size: int) -> int:
        """Slots a region of ``size`` slots takes: the next power of two."""
        return 1 << (size - 1).bit_length()

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Free chunks ``(start, length)``, lowest address first."""
        return sorted((s, 1 << k) for k, starts in self._free.items() for s in starts)

    @property
    def largest_hole(self) -> int:
        return max((1 << k for k, starts in self._free.items() if starts), default=0)

    def fits(self, size: int) -> bool:
        return self.largest_hole >= self.chunk_size(size)

    def reserve(self, owner: Hashable, size: int) -> int | None:
        """Reserve a chunk for ``size`` slots; its start, or None if no chunk is big enough."""
        if owner in self.regions:
            raise ValueError(f"{owner!r} already holds a region")
        if size < 1:
            raise ValueError("a region must have at least one slot")
        want = (size - 1).bit_length()
        free = self._free
        order = min((k for k, starts in free.items() if k >= want and starts), default=None)
        if order is None:
            return None
        start = min(free[order])
        free[order].discard(start)
        while order > want:  # split, keeping the lower half
            order -= 1
            free.setdefault(order, set()).add(start + (1 << order))
        self.regions[owner] = (start, 1 << want)
        self.num_free -= 1 << want
        return start

    def _top(self, start: int) -> tuple[int, int]:
        """``(start, order)`` of the top-level chunk holding address ``start``."""
        for s, k in self._tops:
            if s <= start < s + (1 << k):
                return s, k
        raise AssertionError(f"address {start} outside the space")

    def release(self, owner: Hashable) -> int:
        """Free ``owner``'s chunk, merging buddies; returns the chunk size."""
        start, size = self.regions.pop(owner)
        self.num_free += size
        order = size.bit_length() - 1
        base, top = self._top(start)
        free = self._free
        while order < top:
            buddy = base + ((start - base) ^ (1 << order))
            starts = free.get(order)
            if not starts or buddy not in starts:
                break
            starts.discard(buddy)
            start = min(start, buddy)
            order += 1
        free.setdefault(order, set()).add(start)
        return size

    def check(self) -> None:
        """Assert the invariants (for tests): chunks and free chunks tile the space."""
        runs = sorted([*self.regions.values(), *self.holes])
        pos = 0
        for start, n in runs:
            assert start == pos, f"gap or overlap at {pos}"
            assert n & (n - 1) == 0, f"chunk of {n} slots at {start}"
            base, _ = self._top(start)
            assert (start - base) % n == 0, f"misaligned chunk of {n} at {start}"
            pos += n
        assert pos == self.capacity, "chunks do not cover the space"
        assert self.num_free == sum(n for _, n in self.holes)
        for k, starts in self._free.items():  # a free chunk's buddy is never free too
            for s in starts:
                base, top = self._top(s)
                if k < top:
                    assert base + ((s - base) ^ (1 << k)) not in starts, "unmerged buddies"
