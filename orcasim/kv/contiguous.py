"""A contiguous KV space with first-fit reservations: the allocator of pre-PagedAttention systems.

Orca and FasterTransformer keep each request's KV cache in one contiguous
region of ``capacity`` token slots, reserved when the request starts and
released when it ends. Regions of different sizes leave *holes* between
them: free memory that a new request may not fit into although the total
free memory would be enough (external fragmentation).

:class:`ContiguousSpace` keeps the holes as a sorted list of ``(start,
length)`` and reserves at the lowest address that fits (first fit), merging
neighbouring holes on release. The number of live regions is the batch size,
so the linear scans are short. Pure data structure: no SimPy.
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
