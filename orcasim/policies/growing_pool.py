"""A decode pool in a paged KV pool: its members' blocks taken by phase, per block.

Under a memory section a token policy's running requests decode together in a
:class:`GrowingPool` after a run, as they do in a plain
:class:`~orcasim.policies.decode_pool.DecodePool` without one. Each member
also takes a block whenever its next token starts one: a member that has
computed ``c`` tokens when it joins at pool step ``j``, holding ``h`` blocks of
``bs`` tokens, takes one at the boundary where the pool has taken ``j + h * bs -
c`` steps (its *first round*) and every ``bs`` steps after, until it holds its
final block. Members are kept by *phase* (that round modulo ``bs``), so the
rounds of a run, and the round at the boundary after it, touch only the
members that take a block then: the allocator's per-request block counts
(``held``), free count and internal fragmentation stay exactly those of
step-by-step simulation at every boundary, while the members' token counters
are brought up to date lazily, as the plain pool does.

A member leaves its phase when it takes its final block (its unused tail then
counts as internal fragmentation, as ``PagedAllocator._note_final`` does) or
when it leaves the pool. Pure data structure: no SimPy.
"""

from __future__ import annotations

from typing import Any

from orcasim.kv.allocators import PagedAllocator
from orcasim.policies.decode_pool import DecodePool
from orcasim.request import Request


class GrowingPool(DecodePool):
    """:class:`DecodePool` whose members' paged blocks grow by phase (see the module)."""

    __slots__ = ("alloc", "bs", "exact_round", "phase_of", "phases")

    def __init__(self, alloc: PagedAllocator) -> None:
        super().__init__()
        self.alloc = alloc
        self.bs = bs = alloc.block_size
        #: by phase: request id -> (its first round, its final block count, that block's
        #: unused tail, the member), for the members that have not taken their final block
        #: in a round (one that took it in the step rule's own pass leaves at its next one)
        self.phases: list[dict[int, tuple[int, int, int, Request]]] = [{} for _ in range(bs)]
        #: request id -> its phase, for the members in one
        self.phase_of: dict[int, int] = {}
        #: the round that :meth:`grow_now` left to the step rule, its members due written
        #: (then :meth:`settle` keeps the pool), or -1
        self.exact_round = -1

    # -- membership -------------------------------------------------------------
    def _grows(self, req: Request) -> None:
        """Put ``req``, a member whose counters and blocks are up to date at the pool's
        current step, in its phase if it has blocks still to take."""
        bs = self.bs
        p = req.prompt_len
        footprint = (p if p > 0 else 1) + req.output_len - 1  # known tokens at its last step
        final = -(-footprint // bs)
        h = self.alloc.held[req.id]
        if h >= final:
            return
        first = self.steps + h * bs - req.num_computed_tokens
        phase = first % bs
        self.phases[phase][req.id] = (first, final, final * bs - footprint, req)
        self.phase_of[req.id] = phase

    def _stops(self, rid: int) -> None:
        phase = self.phase_of.pop(rid, None)
        if phase is not None:
            del self.phases[phase][rid]

    def join(self, req: Request) -> None:
        super().join(req)
        self._grows(req)

    def join_all(self, reqs: list[Request]) -> None:
        super().join_all(reqs)
        for req in reqs:
            self._grows(req)

    def end_run(self, k: int, t_end: float, joining: list[Request]) -> tuple[list[Request], int]:
        """:meth:`DecodePool.end_run`; the members taken out leave their phases and
        ``joining`` (their blocks up to date) join theirs. The run's rounds are
        :meth:`rounds`, before this."""
        out, left = super().end_run(k, t_end, joining)
        if self.phase_of:
            for req in out:
                self._stops(req.id)
        for req in joining:
            self._grows(req)
        return out, left

    def leave(self, req: Request) -> None:
        super().leave(req)
        self._stops(req.id)

    def clear(self) -> None:
        super().clear()
        self.exact_round = -1
        if self.phase_of:
            for phase in self.phases:
                phase.clear()
            self.phase_of.clear()

    # -- rounds -----------------------------------------------------------------
    def due_at(self, r: int) -> int:
        """How many members take a block at round ``r`` (a boundary where the pool will
        have taken ``r`` steps; ``r`` at or after its latest round)."""
        held = self.alloc.held
        n = 0
        for rid, (first, final, _, _) in self.phases[r % self.bs].items():
            if first <= r and held[rid] < final:
                n += 1
        return n

    def take(self, r: int) -> tuple[int, int]:
        """Round ``r``: each member due takes a block (``held``); those that take their
        final block leave their phase. Returns the blocks taken and the internal slots
        that appear (the allocator's free count and aggregates are the caller's)."""
        bucket = self.phases[r % self.bs]
        alloc = self.alloc
        held = alloc.held
        taken = tails = 0
        done = None
        for rid, (first, final, tail, _) in bucket.items():
            if first > r:
                continue
            h = held[rid]
            if h < final:
                h += 1
                held[rid] = h
                taken += 1
                if h < final:
                    continue
                alloc._internal[rid] = tail  # its final block, taken now
                tails += tail
            if done is None:
                done = [rid]
            else:
                done.append(rid)
        if done is not None:
            phase_of = self.phase_of
            for rid in done:
                del bucket[rid]
                del phase_of[rid]
        return taken, tails

    def rounds(self, grow: list[int], tails: list[int]) -> None:
        """The rounds of a run of ``len(grow)`` steps from the pool's current step ``S``
        (its boundaries ``S + 1`` to ``S + len(grow) - 1``): add each one's blocks taken
        and internal slots to ``grow[s]`` and ``tails[s]`` (:meth:`take` of each)."""
        if self.phase_of:
            self._rounds(self.steps, grow, tails)

    def _rounds(self, steps: int, grow: list[int], tails: list[int]) -> None:
        phases, bs = self.phases, self.bs
        for s in range(1, len(grow)):
            r = steps + s
            if phases[r % bs]:
                taken, t = self.take(r)
                grow[s] += taken
                tails[s] += t

    def grow_now(self, kv: Any) -> bool:
        """The round at the boundary right after a run (the pool's current step), on
        ``kv`` (the :class:`~orcasim.kv.pool.KVPool` of :attr:`alloc`): if the free blocks
        cover every member due, each takes its block (the order changes nothing) and True;
        else False, having written the counters of the members due (they stay members):
        each running request then takes its block in the step rule's own pass, in its order,
        preempting as it must, and that pass reads a member not due as it joined (a decode
        whose blocks cover its next token either way); see :meth:`settle`."""
        r = self.steps
        bucket = self.phases[r % self.bs]
        if not bucket:
            return True
        alloc = self.alloc
        if len(bucket) > alloc.num_free_blocks and self.due_at(r) > alloc.num_free_blocks:
            members, held = self.members, alloc.held
            for rid, (first, final, _, req) in bucket.items():
                if first <= r and held[rid] < final:
                    since, seq = members[req]
                    if since != r:
                        self._write(req, since)
                        members[req] = (r, seq)
            self.exact_round = r
            return False
        taken, tails = self.take(r)
        alloc.num_free_blocks -= taken
        alloc.internal_slots += tails
        a = alloc.allocated_slots
        if a > kv.peak_allocated:
            kv.peak_allocated = a
        return True

    def settle(self) -> None:
        """Before the step rule's own pass over the running requests: the pool stays as it
        is when that pass gives the blocks of the round :meth:`grow_now` left to it (every
        running request a member); otherwise it is emptied, its members up to date."""
        if self.exact_round != self.steps:
            self.clear()
