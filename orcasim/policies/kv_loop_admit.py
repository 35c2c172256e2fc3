"""Admission at a step boundary of :class:`~orcasim.policies.kv_loop.KVDecodeLoop`.

As the policy's ``admit_fcfs`` with counted admission
(:meth:`~orcasim.policies.kv_admit.KVAdmission._admit_counted`): the requests
put back in front of the queue (refused, preempted) first, then the lazy
source's backlog, first come first served while the blocks of each one's
known tokens fit, stopping at the first that does not (head of line). A
request of the backlog joins as a workload row ``[index, first scheduled,
first token, slot, finish step]`` (``light``), not as a
:class:`~orcasim.request.Request`; one refused stays in the backlog, and a
row preempted (waiting in front, see
:mod:`~orcasim.policies.kv_loop_rows`) joins again as a row. What the loop
does not do itself (a rejection, an error, a step in flight) goes to
``_admit_counted`` from there on.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from orcasim.request import RequestState

RUNNING = RequestState.RUNNING


class KVLoopAdmission:
    """:meth:`_admission`, for :class:`~orcasim.policies.kv_loop.KVDecodeLoop`."""

    if TYPE_CHECKING:  # KVLoopRows'
        def _queued_requests(self) -> None: ...

    def _admission(self, policy: Any, light: bool) -> Callable[[float, int], bool]:
        """Admission at the boundary of batch step ``step`` at ``now`` (its round done), with
        someone waiting, a free slot and the head not refused already (the loop checks);
        the function returns False where the policy's own path takes it. It holds what it
        reads, fixed for the loop's life, as its own variables."""
        ctx = policy.ctx
        batch = policy.batch
        heap, members, free_slots = batch._heap, batch._members, batch._free_slots
        backlog = ctx.waiting
        head = backlog._head
        src = ctx.source
        prompt, output = src._prompt, src._output
        slots = ctx.slots
        cap = slots.capacity
        kv = policy.kv
        alloc = kv.alloc
        held, internal = alloc.held, alloc._internal
        growth = policy.growth
        phases, grow_plan, grow_events = growth.phases, growth._plan, growth._events
        bs = growth.bs
        num_blocks = alloc.capacity_units
        keep_free, max_len, admit = policy.keep_free, policy._max_len, policy._admit_counted
        queued_requests = self._queued_requests  # (the policy's path sees requests only)

        def admit_at(now: float, step: int) -> bool:
            if not light or ctx.busy_until > now:
                if light:
                    queued_requests()
                if not admit(cap - slots.count):
                    return False  # (something else takes part: the policy's own path)
            else:  # (KVAdmission._admit_counted) those put back, then the backlog's rows
                joined = policy._joined
                room = cap - slots.count
                k = backlog._lo
                hi = backlog._hi
                free = alloc.num_free_blocks
                size = batch.size
                seq = batch._next_seq
                next_slot = batch._next_slot
                rows = kv_added = int_added = 0
                early = step > growth.last_round
                rest = False  # what follows takes the policy's path (rejected, raises)
                while room:
                    if head:
                        m = head[0]
                        if type(m) is list:  # a preempted row (see KVLoopRows)
                            rid = m[0]
                            p, o, out = prompt[rid], output[rid], m[5]
                        else:
                            p, o, out, rid = m.prompt_len, m.output_len, m.num_output_tokens, m.id
                        p1 = p if p > 0 else 1
                        need = -(-(p1 + out) // bs)
                        if (max_len is not None and p1 + o > max_len) or rid in held:
                            rest = True
                            break
                        if need + (keep_free if size else 0) > free:
                            if need > num_blocks:
                                rest = True
                                break
                            policy._blocked = True  # refused (try_join)
                            policy._miss = (m, need, 0, 0)
                            break
                        if o - out <= 0:
                            rest = True
                            break
                        head.popleft()
                        if free_slots:  # (DecodeBatch.add: the lowest free slot)
                            slot = heappop(free_slots)
                        else:
                            slot = next_slot
                            next_slot += 1
                        if type(m) is list:  # preempted, scheduled before
                            slots.count += 1
                            m[3] = slot
                            m[4] = step + o - out
                        else:
                            m.slot = slot
                            if m.state != RUNNING:  # (SchedulerContext.admit)
                                slots.count += 1
                                m.state = RUNNING
                            if m.first_scheduled is None:
                                m.first_scheduled = now
                                ctx.num_started += 1
                            m._batch_seq = seq
                            m._done_at = step + o - out
                        heappush(heap, (step + o - out, seq, m))
                        kv_added += p + out
                    else:
                        if k >= hi:
                            break
                        p = prompt[k]
                        p1 = p if p > 0 else 1
                        o = output[k]
                        out = 0
                        rid = k
                        need = -(-p1 // bs)
                        if (need + (keep_free if size else 0) > free or o <= 0
                                or (max_len is not None and p1 + o > max_len)):
                            if o <= 0 or need > num_blocks or (max_len is not None
                                                               and p1 + o > max_len):
                                rest = True
                                break
                            policy._blocked = True  # refused (try_join): it stays in the
                            policy._miss = None  # backlog, tried again at the next boundary
                            break
                        if free_slots:
                            slot = heappop(free_slots)
                        else:
                            slot = next_slot
                            next_slot += 1
                        m = [k, now, None, slot, step + o]
                        heappush(heap, (step + o, seq, m))
                        kv_added += p
                        rows += 1
                        k += 1
                    free -= need  # (PagedAllocator.admit, DecodeBatch.add)
                    held[rid] = need
                    policy._miss = None
                    members[seq] = m
                    joined.append(m)
                    held_slots = need * bs
                    tail = held_slots - (p1 + o - 1)  # its final block's unused slots
                    if tail >= 0:
                        internal[rid] = tail
                        int_added += tail
                    else:  # it grows (DecodeGrowth.join)
                        g = -(tail // bs)
                        fg = step + held_slots + 1 - (p1 + out)
                        grow_plan[rid] = (need, fg, g, seq, tail + g * bs)
                        if early:
                            growth._early.append((fg % bs, seq, rid))
                        else:
                            phases[fg % bs][seq] = rid
                        heappush(grow_events, (fg + bs * (g - 1), seq, rid))
                    seq += 1
                    size += 1
                    room -= 1
                if size > batch.size:
                    slots.count += rows
                    ctx.num_started += rows
                    batch.size = size
                    batch._next_seq = seq
                    batch._next_slot = next_slot
                    batch.num_kv_tokens += kv_added
                    alloc.num_free_blocks = free
                    alloc.internal_slots += int_added
                    a = (num_blocks - free) * bs
                    if a > kv.peak_allocated:
                        kv.peak_allocated = a
                backlog._lo = k
                if rest:
                    queued_requests()
                    if not admit(room):
                        return False
            return True

        return admit_at
