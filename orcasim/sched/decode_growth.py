"""Paged block growth of a decode batch, in O(1) per step while memory is ample.

In a decode batch every member gains one token per step, so a member that
holds ``h`` token slots needs its next block at a step it can compute on
joining, and then every ``block_size`` steps until it holds its footprint.
Members are therefore grouped by *phase* (the step modulo ``block_size`` at
which they grow): at step ``s`` exactly the members of phase ``s mod
block_size`` that have started and not finished growing take one block each.
When the pool has that many free blocks, the whole step's growth is one
subtraction (:meth:`DecodeGrowth.round`); only when it does not does the
caller walk the members, in the order they joined, preempting as needed.
Each member costs one heap event (the end of its growth: its final block's
unused tail becomes internal fragmentation), not one per block. A member
stays in its phase until it leaves: its phase's next round after its last
block comes at or after the step it finishes in, when it has left.
Members are known by request id (a lazy source's workload index) and batch
sequence number, never as objects, so a member may be a request or a
workload row (:class:`~orcasim.policies.kv_loop.KVDecodeLoop`).

The allocator's per-request block counts are brought up to date when a
member leaves (:meth:`DecodeGrowth.leave`, before its memory is released or
swapped). Pure data structure: no SimPy.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from orcasim.kv.allocators import PagedAllocator
from orcasim.request import Request

#: the phases repeated this many times in :attr:`DecodeGrowth.ring`
RING = 64


class DecodeGrowth:
    """Which members of a decode batch take a block at each step, by phase."""

    def __init__(self, alloc: PagedAllocator) -> None:
        self.alloc = alloc
        self.bs = bs = alloc.block_size
        self._num_blocks = alloc.layout.num_blocks
        # by phase: batch seq -> request id of the members growing then
        self.phases: list[dict[int, int]] = [{} for _ in range(bs)]
        #: the phases over and over (``ring[i] is phases[i % bs]``): the rounds of a run of
        #: steps are a slice of it (:class:`~orcasim.policies.kv_loop.KVDecodeLoop`)
        self.ring = self.phases * RING
        self._events: list[tuple[int, int, int]] = []  # (last growth step, seq, request id)
        # request id -> (blocks at joining, first growth step, growths in all, batch seq,
        # the unused tail of its final block); a member's entry until it leaves (an event or
        # a phase entry whose seq differs is stale: it left, and may have joined again)
        self._plan: dict[int, tuple[int, int, int, int, int]] = {}
        self.last_round = -1
        # members of this round's phase still waiting for their block (exact path only)
        self._pending: set[int] = set()
        # members that joined at a step whose round has not run yet (added after it)
        self._early: list[tuple[int, int, int]] = []  # (phase, seq, request id)

    def join(self, req: Request, step: int, known: int) -> None:
        """``req`` joined at batch step ``step`` with ``known`` tokens and its blocks allocated.

        The member grows first at a step in ``(step, step + block_size]``, the
        only one of its phase there; if ``step``'s round has not run yet (a
        process admitted it at the step boundary), it joins its phase after it.
        (:meth:`~orcasim.policies.kv_admit.KVAdmission._admit_counted` does the same inline.)
        """
        bs = self.bs
        rid = req.id
        held = self.alloc.held[rid]
        slots = held * bs
        final = max(req.prompt_len, 1) + req.output_len - 1  # known tokens at its last step
        if slots >= final:
            return
        first = step + slots + 1 - known  # in (step, step + bs]: no earlier step has its phase
        growths = -(-(final - slots) // bs)
        seq = req._batch_seq
        self._plan[rid] = (held, first, growths, seq, slots + growths * bs - final)
        if step > self.last_round:
            self._early.append((first % bs, seq, rid))
        else:
            self.phases[first % bs][seq] = rid
        heapq.heappush(self._events, (first + bs * (growths - 1), seq, rid))

    def round(self, step: int) -> dict[int, int] | None:
        """All of ``step``'s growth when the free blocks cover it; else the members due.

        On None the round is done; on a dict (batch seq -> request id) the
        caller gives each member its block with :meth:`grow_due`, preempting
        as needed, and then calls
        :meth:`end_round`. A second round at the same step does nothing.
        """
        if step == self.last_round:
            return None
        self.last_round = step
        due = self.phases[step % self.bs]
        n = len(due)
        if n:
            alloc = self.alloc
            if n > alloc.num_free_blocks:
                return due
            alloc.num_free_blocks -= n
        ev = self._events
        if (ev and ev[0][0] <= step) or self._early:
            self.end_round(step)
        return None

    def covered(self, step: int, limit: int) -> int:
        """How many of the rounds ``step + 1``, ``step + 2``, ... (``limit`` at most) the free
        blocks cover if nobody joins or leaves: a run of decode steps takes them one by one.

        O(1) while the free blocks cover a block per member and round of its phase
        over the window.
        """
        free = self.alloc.num_free_blocks
        bs = self.bs
        phases = self.phases
        if self._early or (limit and len(phases[(step + 1) % bs]) > free):
            return 0
        if free >= len(self._plan) * (limit // bs + 1):
            return limit
        for j in range(limit):
            free -= len(phases[(step + 1 + j) % bs])
            if free < 0:
                return j
        return limit

    def run_rounds(self, step: int, k: int) -> tuple[list[int], list[int]]:
        """The rounds ``step + 1`` to ``step + k``, which :meth:`covered` said the free blocks
        cover: the allocator's allocated and internal slots before them and after each.

        The same effects as :meth:`round` once per step, for a run of decode steps.
        """
        alloc = self.alloc
        phases = self.phases
        bs = self.bs
        ev = self._events
        num_blocks = self._num_blocks
        last = step + k
        used = num_blocks - alloc.num_free_blocks  # blocks
        if not ev or ev[0][0] > last:  # nobody stops growing: the internal slots stay
            allocated = [used * bs]
            append = allocated.append
            for s in range(step + 1, last + 1):
                used += len(phases[s % bs])
                append(used * bs)
            internals = [alloc.internal_slots] * (k + 1)
        else:
            stop = ev[0][0]  # the next round where a member stops growing
            internal = alloc.internal_slots
            allocated = [used * bs]
            internals = [internal]
            append, append_internal = allocated.append, internals.append
            for s in range(step + 1, last + 1):
                used += len(phases[s % bs])
                if s >= stop:
                    self.end_round(s)
                    stop = ev[0][0] if ev else last + 1
                    internal = alloc.internal_slots
                append(used * bs)
                append_internal(internal)
        if used > num_blocks:
            raise ValueError(f"rounds {step + 1} to {last} need more blocks than are free")
        alloc.num_free_blocks = num_blocks - used
        if k:
            self.last_round = last
        return allocated, internals

    def grow_due(self, due: dict[int, int], preempt: Callable[[], int]) -> None:
        """The exact path of a round that :meth:`round` left to the caller: each due member,
        in the order they joined, takes a free block; while none is free, ``preempt()``
        takes a victim out of the batch (through :meth:`leave`, freeing its blocks) and
        returns its request id, and a member that is itself the victim takes none. The
        caller then calls :meth:`end_round`."""
        alloc = self.alloc
        plan = self._plan
        pending = self._pending = set(due)
        for seq, rid in sorted(due.items()):
            p = plan.get(rid)
            if p is None or p[3] != seq:  # preempted earlier in this round
                continue
            while not alloc.num_free_blocks:
                if preempt() == rid:
                    break
            else:
                alloc.num_free_blocks -= 1
                pending.discard(seq)

    def end_round(self, step: int) -> None:
        """After ``step``'s growth: members whose last block that was hold their final
        block (its unused tail counts as internal fragmentation from this step on)."""
        if self._pending:
            self._pending = set()
        plan = self._plan
        if self._early:
            for phase, seq, rid in self._early:
                p = plan.get(rid)
                if p is not None and p[3] == seq:  # still in the batch
                    self.phases[phase][seq] = rid
            self._early = []
        ev = self._events
        while ev and ev[0][0] <= step:
            _, seq, rid = heapq.heappop(ev)
            p = plan.get(rid)
            if p is not None and p[3] == seq:
                self._stop(rid)

    def _stop(self, rid: int) -> None:
        tail = self._plan[rid][4]
        alloc = self.alloc
        alloc._internal[rid] = tail  # its final block: as PagedAllocator._note_final
        alloc.internal_slots += tail

    def leave(self, rid: int) -> None:
        """The member with request id ``rid`` leaves the batch: write its block count back
        to the allocator."""
        plan = self._plan.pop(rid, None)
        if plan is None:
            return
        held, first, growths, seq, _ = plan
        self.phases[first % self.bs].pop(seq, None)
        r = self.last_round
        done = 0 if r < first else min(growths, (r - first) // self.bs + 1)
        if seq in self._pending:
            self._pending.discard(seq)
            done -= 1  # due this round, preempted before it got its block
        self.alloc.held[rid] = held + done
