"""Growth, preemption and swap-in of a decode batch under a KV memory limit.

Mixed into :class:`~orcasim.policies.memory.KVDecodePolicy`: when the free
blocks do not cover a step's growth, its members take their blocks one by one
in the order they joined (:meth:`KVPreemption._grow_exact`), and a member that
finds none free preempts a victim (the last admitted, or the lowest priority)
by recompute or swap; swapped-out requests come back first come, first served
(:meth:`KVPreemption._swap_in`) before new requests are admitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappush
from typing import TYPE_CHECKING, Any

from orcasim.batch import DecodeBatch
from orcasim.errors import SimulationError
from orcasim.request import Request, RequestState
from orcasim.sched.decode_growth import DecodeGrowth


def row_request(src: Any, row: list, seq: int) -> Request:
    """The running request of the batch member ``seq`` held as a workload row ``[index,
    first scheduled, first token, slot, finish step]`` (see
    :class:`~orcasim.policies.kv_loop.KVDecodeLoop`), made by the lazy source ``src``; a row
    preempted before (see :func:`queued_request`) also brings its tokens, preemptions and
    last token."""
    req = src.running_request(row[0], row[1], row[2], row[3], seq, row[4])
    if len(row) > PREEMPTED_ROW:
        req.num_output_tokens, req.num_preemptions, req.last_token = row[5:]
    return req


#: a row ``[index, first scheduled, first token, slot, finish step]`` preempted by recompute
#: gains ``[generated tokens, preemptions, last token]`` and waits in the queue
PREEMPTED_ROW = 5


def queued_request(src: Any, row: list) -> Request:
    """The preempted request that a row waiting in the queue (``[index, first scheduled,
    first token, slot, finish step, generated tokens, preemptions, last token]``, see
    :meth:`KVPreemption._recompute_newest`) stands for, made by the lazy source ``src``."""
    k = row[0]
    req = src._request(k, src._arrival[k])
    req.state = RequestState.PREEMPTED
    req.first_scheduled = row[1]
    req.first_token = row[2]
    req._done_at = row[4]
    req.num_output_tokens, req.num_preemptions, req.last_token = row[5:]
    return req


class KVPreemption:
    """The exact growth round, victims, preemption and swap-in of ``KVDecodePolicy``."""

    kv: Any
    ctx: Any
    batch: DecodeBatch
    growth: DecodeGrowth | None
    swap: bool
    victim_rule: str
    keep_free: int
    _blocked: bool
    _swapped: deque[Request]
    _swapped_in: list[Request]
    #: the waiting queue and :meth:`_recompute_newest`'s preemption for it
    _newest: tuple[Any, Callable[[], int]] | None = None

    if TYPE_CHECKING:  # the policy's
        def room(self) -> int: ...
        def join(self, req: Request) -> None: ...

    def _grow_exact(self, due: dict[int, int]) -> float:
        """Give the due members their next block one by one, preempting as needed.

        Returns the seconds of swapping the preemptions cost.
        """
        growth = self.growth
        assert growth is not None
        step = self.batch.num_steps
        if not self.swap and self.victim_rule == "last_admitted":
            made = self._newest  # (made once for the queue it puts victims back into)
            waiting = self.ctx.waiting
            if made is None or made[0] is not waiting:
                made = self._newest = (waiting, self._recompute_newest())
            growth.grow_due(due, made[1])
            growth.end_round(step)
            return 0.0
        secs = 0.0
        victim_of = self._victim
        preempt = self._preempt

        def take() -> int:
            nonlocal secs
            victim = victim_of()
            secs += preempt(victim)
            return victim.id

        growth.grow_due(due, take)
        growth.end_round(step)
        return secs

    def _recompute_newest(self) -> Callable[[], int]:
        """What preempts for :meth:`_grow_exact` with the defaults (the last admitted, by
        recompute): :meth:`_victim` and :meth:`_preempt`, with the batch's ``remove`` and the
        pool's ``release`` done in place. A victim held as a workload row (in
        :class:`~orcasim.policies.kv_loop.KVDecodeLoop`) goes back as a row."""
        batch = self.batch
        members = batch._members
        free_slots = batch._free_slots
        ctx = self.ctx
        kv = self.kv
        alloc = kv.alloc
        held = alloc.held
        internal = alloc._internal
        growth: Any = self.growth
        leave = growth.leave
        plan, phases, bs = growth._plan, growth.phases, growth.bs
        preempted = ctx.preempted
        released = kv._released
        requeue = ctx.waiting.appendleft

        def take_request(seq: int, victim: Request) -> int:
            """``take`` for a request."""
            rid = victim.id
            leave(rid)
            # (DecodeBatch.remove) its generated tokens written back, its slot freed
            victim.num_output_tokens = out = victim.output_len - (victim._done_at
                                                                  - batch.num_steps)
            del members[seq]
            batch.size -= 1
            victim._batch_seq = -1
            batch.num_kv_tokens -= victim.prompt_len + out
            heappush(free_slots, victim.slot)
            victim.slot = -1
            victim.last_token = ctx.last_step_end  # it emitted a token in the last step
            # it loses the KV of its prompt and of every generated token but the newest
            p = victim.prompt_len
            preempted(victim, "kv_full", recompute=(p if p > 0 else 1) + out - 1)
            alloc.internal_slots -= internal.pop(rid, 0)
            alloc.num_free_blocks += held.pop(rid)
            released()
            requeue(victim)
            return rid

        def take() -> int:
            seq = next(reversed(members))
            row = members[seq]  # (DecodeBatch.newest)
            if type(row) is not list:
                return take_request(seq, row)
            # a workload row (KVDecodeLoop): it stays one, and goes back in front of the
            # queue with its tokens, preemptions and last token (nobody waits on a slot or the
            # pool in the loop, so a slot and blocks given back are counts)
            k = row[0]
            src = ctx.source
            g = plan.pop(k, None)  # (DecodeGrowth.leave)
            if g is None:
                blocks = held.pop(k)
            else:
                blocks, first, growths, gseq, _ = g
                r = growth.last_round
                if r >= first:
                    blocks += min(growths, (r - first) // bs + 1)
                phases[first % bs].pop(gseq, None)
                pending = growth._pending
                if gseq in pending:  # due this round, preempted before it got its block
                    pending.discard(gseq)
                    blocks -= 1
                del held[k]
            p = src._prompt[k]
            out = src._output[k] - (row[4] - batch.num_steps)
            del members[seq]
            batch.size -= 1
            batch.num_kv_tokens -= p + out
            heappush(free_slots, row[3])
            row[3] = -1
            if len(row) > PREEMPTED_ROW:
                row[5] = out
                row[6] += 1
                row[7] = ctx.last_step_end
            else:
                row += (out, 1, ctx.last_step_end)
            ctx.slots.count -= 1  # (SchedulerContext.preempted)
            counts = ctx.preemptions
            counts["kv_full"] = counts.get("kv_full", 0) + 1
            ctx.num_recomputed_tokens += (p if p > 0 else 1) + out - 1
            alloc.internal_slots -= internal.pop(k, 0)
            alloc.num_free_blocks += blocks
            kv.num_releases += 1  # (KVPool._released)
            requeue(row)
            return k

        return take

    def _no_progress(self, req: Request) -> SimulationError:
        kv = self.kv
        assert kv is not None
        return SimulationError(
            f"preemption loop at t={self.ctx.now:.6g}: request {req.label} was preempted with "
            f"{req.prompt_len} prompt + {req.num_output_tokens} generated tokens, which need "
            f"{kv.need(req)} KV blocks of {kv.block_size} tokens, but the pool has "
            f"{kv.capacity_units}: it cannot run even alone, so preempting it again makes "
            f"no progress"
        )

    def _victim(self) -> Request:
        batch = self.batch
        if self.victim_rule == "last_admitted":
            v = batch.newest()
            assert v is not None
            return v
        # vLLM's convention: a larger priority value is less important; latest arrival on ties
        return max(batch, key=lambda r: (r.priority, r.arrival, r.id))

    def _preempt(self, victim: Request) -> float:
        """Take ``victim`` out of the batch; seconds its swap-out takes (0 for recompute)."""
        ctx = self.ctx
        kv = self.kv
        assert kv is not None
        if self.growth is not None:
            self.growth.leave(victim.id)
        self.batch.remove(victim)
        victim.last_token = ctx.last_step_end  # it emitted a token in the last step
        if self.swap:
            secs = kv.swap_out(victim)
            if secs is not None:
                ctx.preempted(victim, "kv_full")
                self._swapped.append(victim)
                return secs
        # it loses the KV of its prompt and of every generated token but the newest
        ctx.preempted(victim, "kv_full",
                      recompute=max(victim.prompt_len, 1) + victim.num_output_tokens - 1)
        kv.release(victim)
        ctx.waiting.appendleft(victim)
        return 0.0

    def _swap_in(self) -> float:
        """Swap requests back in, first come first served, while they fit; seconds it takes."""
        kv = self.kv
        assert kv is not None
        swapped = self._swapped
        room = self.room()
        secs = 0.0
        while swapped and room > 0:
            req = swapped[0]
            if kv.need(req) > kv.capacity_units:
                raise self._no_progress(req)
            t = kv.swap_in(req, self.keep_free if self.batch.size else 0)
            if t is None:
                self._blocked = True
                break
            swapped.popleft()
            secs += t
            self.join(req)
            self._swapped_in.append(req)
            room -= 1
        return secs
