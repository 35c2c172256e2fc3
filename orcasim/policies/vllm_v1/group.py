"""The vllm-v1 policy's running requests in steady decode, advanced together (no SimPy).

A running request that sampled a token in the last step and has every
known token but that one computed (``computed == known - 1``) decodes one
token in each following schedule call of vLLM V1's scheduler while nothing
stops it. :class:`DecodeGroup` keeps such requests as one batch with a step
count shared by all, like :class:`~orcasim.batch.DecodeBatch`: a member's
computed tokens are its *base* plus the count, so a step advances every
member by adding one to the count. Per step, only the members at a block
boundary are touched: those whose next slot starts a block (a new block),
whose scheduled token fills a block (a prefix-cache entry) and whose sampled
token completes a block of known tokens (a hash). Members are bucketed by
their base modulo the block size, so the members at a boundary in a step
are one bucket, in running order. A heap gives each member's last step.
"""

from __future__ import annotations

import heapq
from typing import Any

from orcasim.request import Request


class DecodeGroup:
    """Members (a prefix of the running list, in its order) with bases against one count.

    After the output of the step that brought the count to ``count``, a
    member with base ``b`` and prompt ``P`` has computed ``b + count`` tokens
    and generated ``b + count + 1 - P``; its last token came at ``last_end``.
    While a step scheduled by the group is in flight (``out`` is its output
    record), the count already includes it and the step's token is not yet
    generated.
    """

    __slots__ = (
        "_next",
        "bases",
        "block_size",
        "buckets",
        "count",
        "heap",
        "last_end",
        "members",
        "out",
        "pairs",
        "total",
    )

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.members: list[Request] = []
        self.bases: list[int] = []
        self.pairs: list[tuple[Request, int]] = []  # (member, 1): its entry in a step's plan
        self.buckets: list[list[Request]] = [[] for _ in range(block_size)]
        self.heap: list[tuple[int, int, Request]] = []  # (last count, join order, request)
        self.count = 0
        self.total = 0  # the members' bases summed (their computed tokens: total + size * count)
        self.last_end = 0.0
        self.out: Any = None  # the in-flight step the group scheduled (None: none)
        self._next = 0

    def __len__(self) -> int:
        return len(self.members)

    def join(self, req: Request, seq: Any, computed: int, max_model_len: int) -> None:
        """Add ``req``, a steady decoder with ``computed`` tokens computed (after the running
        list's current members); ``seq`` keeps its base."""
        base = computed - self.count
        seq.base = base
        self.members.append(req)
        self.bases.append(base)
        self.total += base
        self.pairs.append((req, 1))
        self.buckets[base % self.block_size].append(req)
        # it samples its last token in the step whose output brings the count to ``last``
        last = req.output_len + (req.prompt_len or 1)  # min(last, max_model_len), written out
        last = (last if last < max_model_len else max_model_len) - 1 - base
        heapq.heappush(self.heap, (last, self._next, req))
        self._next += 1

    def at(self, offset: int) -> list[Request]:
        """Members with ``base + count + offset`` a multiple of the block size, in order."""
        return self.buckets[-(self.count + offset) % self.block_size]

    def boundary_blocks(self, start: int, stop: int, alloc: int,
                        allocs: list[int]) -> list[Request]:
        """The members that start a new block in the steps that bring the count from
        ``start`` to ``stop`` (step ``j``'s are the bucket ``-j % block_size``), in step
        order; appends to ``allocs`` the slots allocated after each of those steps took its
        blocks, from ``alloc`` (the memory rows of a run)."""
        bs = self.block_size
        buckets = self.buckets
        new: list[Request] = []
        for j in range(start, stop):
            taken = buckets[-j % bs]
            if taken:
                new += taken
                alloc += bs * len(taken)
            allocs.append(alloc)
        return new

    def first_last(self) -> int:
        """The least count at which a member samples its last token."""
        return self.heap[0][0]

    def pop_finished(self) -> list[Request]:
        """Members that sampled their last token at the current count, in running order,
        taken out of the group."""
        heap = self.heap
        done: list[Request] = []
        count = self.count
        while heap and heap[0][0] <= count:
            last, _, req = heapq.heappop(heap)
            if last < count:
                raise AssertionError(f"request {req.label} decoded past its last token")
            done.append(req)
        members, bases, buckets, bs = self.members, self.bases, self.buckets, self.block_size
        for req in done:
            i = members.index(req)
            buckets[bases[i] % bs].remove(req)
            self.total -= bases[i]
            del members[i], bases[i], self.pairs[i]
        return done

    def clear(self) -> None:
        """Forget every member (their counters were written back)."""
        self.members = []
        self.bases = []
        self.total = 0
        self.pairs = []
        self.buckets = [[] for _ in range(self.block_size)]
        self.heap = []
        self.out = None
