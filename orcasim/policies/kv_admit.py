"""Admission of a decode batch under a KV memory limit (mixed into ``KVDecodePolicy``).

A waiting request joins only if the memory of its known tokens fits
(:meth:`KVAdmission.try_join`); ``kv_admission: head_of_line`` stops at the
first that does not, ``skip`` tries those behind it (:meth:`KVAdmission.admit_fcfs`).
A refused head of the queue is refused again from its block count alone
until memory is released. Into a plain paged pool, head-of-line admission
counts blocks in one loop (:meth:`KVAdmission._admit_counted`) with the effects
of the per-request calls (``tests/test_kv_admission.py`` compares the two).
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, ClassVar

from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.batch import DecodeBatch
    from orcasim.errors import SimulationError
    from orcasim.sched.decode_growth import DecodeGrowth

RUNNING = RequestState.RUNNING


class KVAdmission:
    """``try_join`` and first-come-first-served admission of ``KVDecodePolicy``."""

    kv: Any
    ctx: Any
    batch: DecodeBatch
    growth: DecodeGrowth | None
    head_of_line: bool
    keep_free: int
    _max_len: int | None
    _blocked: bool
    _miss: tuple[Request, int, int, int] | None
    _counted: bool
    _joined: list[Request]

    #: admit into a plain paged pool in one loop that counts blocks (off: one
    #: :meth:`try_join` per request, through the pool's :meth:`~orcasim.kv.pool.KVPool.admit`)
    counted_admission: ClassVar[bool] = True

    if TYPE_CHECKING:  # the policy's
        def room(self) -> int: ...
        def join(self, req: Request) -> None: ...
        def _no_progress(self, req: Request) -> SimulationError: ...

    def try_join(self, req: Request) -> bool | None:
        """Admit ``req`` if its memory fits: True (joined), False (no room now), None (removed).

        ``req`` must already be out of the waiting queue. A request that can
        never run is rejected (None); one that does not fit now is left to the
        caller to put back (False).
        """
        kv = self.kv
        if kv is None:
            self.join(req)
            return True
        m = self._max_len
        if m is not None and max(req.prompt_len, 1) + req.output_len > m:  # kv.too_long(req)
            self.ctx.reject(req, "exceeds_max_model_len")
            return None
        keep = self.keep_free if self.batch.size else 0
        miss = self._miss
        if miss is not None and miss[0] is req and self._refused_again(miss, keep):
            self._blocked = True
            return False
        if not kv.admit(req, keep):
            need = kv.need(req)
            if need > kv.capacity_units:  # it never will
                if req.num_output_tokens == 0:
                    self.ctx.reject(req, "exceeds_kv_capacity")
                    return None
                raise self._no_progress(req)
            self._blocked = True
            self._miss = (None if kv.has_getters else (req, need, 0, 0) if kv.paged
                          else (req, kv.num_releases, kv.free_units, keep))
            return False
        self._miss = None
        self.join(req)
        return True

    def _refused_again(self, miss: tuple[Request, int, int, int], keep: int) -> bool:
        """Whether ``kv.admit(miss[0], keep)`` would refuse the last refused request again."""
        kv: Any = self.kv
        if kv.has_getters:
            return False  # the allocator is asked (it refuses behind a get)
        if kv.paged:  # its need is fixed while it waits: the free blocks decide
            return miss[1] + keep > kv.alloc.num_free_blocks
        # nothing was released since it last did not fit
        return miss[1] == kv.num_releases and kv.free_units <= miss[2] and keep >= miss[3]

    def admit_fcfs(self) -> None:
        """First come, first served while there is room, per ``kv_admission``."""
        waiting = self.ctx.waiting
        room = self.room()
        if self.head_of_line:
            miss = self._miss
            if (miss is not None and waiting and waiting[0] is miss[0]
                    and self._refused_again(miss, self.keep_free if self.batch.size else 0)):
                self._blocked = True  # the head waits for memory, as try_join would say
                return
            if self._counted and self._admit_counted(room):
                return
            try_join = self.try_join
            popleft = waiting.popleft
            while room > 0 and waiting:
                req = popleft()
                ok = try_join(req)
                if ok is False:
                    waiting.appendleft(req)
                    return
                room -= ok is True
            return
        skipped = []
        kv = self.kv
        while waiting and room > 0 and kv.free_units > 0:  # type: ignore[union-attr]
            req = waiting.popleft()
            ok = self.try_join(req)
            if ok is False:
                skipped.append(req)
            room -= ok is True
        if skipped:
            waiting.extendleft(reversed(skipped))

    def _admit_counted(self, room: int, put_back: bool = False) -> bool:
        """:meth:`admit_fcfs`'s head-of-line loop of :meth:`try_join` calls, for a plain paged
        pool: the same admissions, refusals and rejections, in the same order, with the
        allocator's, context's, batch's and growth's bookkeeping done here. False (nothing
        done) where something else takes part: a waiting ``kv.get``, an admission callback
        or listener, a step in flight. ``put_back``: only the requests put back in front of
        a lazy source's backlog (its ``_head``), not its rows."""
        ctx = self.ctx
        kv: Any = self.kv
        if (kv._getters or ctx.on_admit is not None or ctx._admitted is not None
                or ctx.busy_until > ctx.env._now):
            return False
        waiting = ctx.waiting
        popleft = waiting.popleft
        alloc = kv.alloc
        bs = alloc.block_size
        held = alloc.held
        internal = alloc._internal
        batch = self.batch
        heap = batch._heap
        members = batch._members
        free_slots = batch._free_slots
        step = batch.num_steps
        joined = self._joined
        growth: Any = self.growth
        grow_plan = growth._plan
        phases = growth.phases
        grow_events = growth._events
        grow_early = growth._early
        early = step > growth.last_round  # its round has not run yet: members join after it
        slots = ctx.slots
        cap = slots.capacity
        max_len = self._max_len
        keep_free = self.keep_free
        start = ctx.env._now
        started = 0
        room0 = room
        queue = waiting._head if put_back else waiting
        while room > 0 and queue:
            req = popleft()
            p = req.prompt_len
            if p < 1:
                p = 1
            out = req.num_output_tokens
            if max_len is not None and p + req.output_len > max_len:
                ctx.reject(req, "exceeds_max_model_len")
                continue
            n = -(-(p + out) // bs)  # kv.need(req)
            free = alloc.num_free_blocks
            if n + (keep_free if batch.size else 0) > free:  # refused (try_join)
                if n > alloc.capacity_units:  # it never will
                    if out == 0:
                        ctx.reject(req, "exceeds_kv_capacity")
                        continue
                    raise self._no_progress(req)
                self._blocked = True
                self._miss = (req, n, 0, 0)
                waiting.appendleft(req)
                break
            rid = req.id
            if rid in held:
                alloc.admit(req)  # (raises: it already holds blocks)
            alloc.num_free_blocks = free - n  # (PagedAllocator.admit)
            held[rid] = n
            output_len = req.output_len
            tail = n * bs - (p + output_len - 1)  # its final block's unused slots, if it holds it
            if tail >= 0:
                internal[rid] = tail
                alloc.internal_slots += tail
            self._miss = None
            if req.state != RUNNING:  # (SchedulerContext.admit)
                if slots.reserved or slots.count >= cap:
                    slots.admit(req)
                else:
                    slots.count += 1
                req.state = RUNNING
            if req.first_scheduled is None:
                req.first_scheduled = start
                started += 1
            remaining = output_len - out  # (DecodeBatch.add)
            if remaining <= 0:
                batch.add(req)  # (raises: nothing left to generate)
            seq = batch._next_seq
            batch._next_seq = seq + 1
            req._batch_seq = seq
            req._done_at = done = step + remaining
            heappush(heap, (done, seq, req))
            members[seq] = req
            batch.size += 1
            if free_slots:
                req.slot = heappop(free_slots)
            else:
                req.slot = batch._next_slot
                batch._next_slot += 1
            batch.num_kv_tokens += req.prompt_len + out
            joined.append(req)
            if tail < 0:  # it grows: by phase, first at step first (DecodeGrowth.join)
                first = step + n * bs + 1 - (p + out)
                growths = -(tail // bs)  # ceil(-tail / bs)
                grow_plan[rid] = (n, first, growths, seq, tail + growths * bs)
                if early:
                    grow_early.append((first % bs, seq, rid))
                else:
                    phases[first % bs][seq] = rid
                heappush(grow_events, (first + bs * (growths - 1), seq, rid))
            room -= 1
        ctx.num_started += started
        if room < room0:  # (KVPool.admit: the peak, after the last admission)
            a = (alloc.capacity_units - alloc.num_free_blocks) * bs
            if a > kv.peak_allocated:
                kv.peak_allocated = a
        return True
