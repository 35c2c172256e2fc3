"""Runs of a first-come-first-served decode batch under a paged KV memory limit, in one loop.

``continuous`` with a paged ``memory`` section makes the same boundaries as
without one, plus memory: each boundary grows members by a block (a round of
:class:`~orcasim.sched.decode_growth.DecodeGrowth`), admits the queue's head
while its blocks fit, and each step records the pool's state.
:class:`KVDecodeLoop` takes run after run of such a batch in one frame, as
:class:`~orcasim.policies.decode_loop.FcfsDecodeLoop` does without memory,
while nothing is swapped out and nothing else is due in SimPy's queue. A
boundary whose growth the free blocks do not cover takes the policy's exact
round (members take their blocks one by one, preempting by recompute); with
``preemption: swap`` it goes back to the engine, which charges the swap time. A run is as long as
:meth:`~orcasim.policies.kv_runs.KVDecodeRuns.decode_run` would offer (down
to one step), and its effects are those of the policy's ``complete_run``,
bit for bit (``tests/test_kv_loop.py`` compares the loop, the policy's runs
and step-by-step simulation). Requests of the backlog join as workload rows
(:mod:`~orcasim.policies.kv_loop_admit`), stay rows when preempted (in front
of the queue) and joining again, and become requests when the loop hands a
boundary back (:mod:`~orcasim.policies.kv_loop_rows`).
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from orcasim.errors import SimulationError
from orcasim.metrics.kv_series import BUFFER as KV_BUFFER
from orcasim.metrics.request_rows import DONE_BLOCK
from orcasim.policies.decode_loop import FcfsDecodeLoop
from orcasim.policies.kv_loop_admit import KVLoopAdmission
from orcasim.policies.kv_loop_check import KVLoopCheck
from orcasim.policies.kv_loop_rows import KVLoopRows
from orcasim.policies.kv_preempt import KVPreemption
from orcasim.request import RequestState

if TYPE_CHECKING:
    from orcasim.engine import Engine

FINISHED = RequestState.FINISHED
#: the preemption that takes rows (a replacement would see requests only)
RECOMPUTE_NEWEST = KVPreemption._recompute_newest


class KVDecodeLoop(KVLoopCheck, KVLoopAdmission, KVLoopRows, FcfsDecodeLoop):
    """Whole runs of a first-come-first-served decode batch in a paged pool (see the module)."""

    #: off: the engine takes every run through the policy's and recorder's methods
    enabled = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.env = engine.env
        self.ctx = ctx = engine.ctx
        self.policy = policy = engine.policy
        self.batch = policy.batch  # type: ignore[attr-defined]
        self.source = ctx.source  # type: ignore[assignment]
        self.rec = ctx.recorder
        self._coef = {}
        self.kv: Any = policy.kv  # type: ignore[attr-defined]
        self.growth: Any = policy.growth  # type: ignore[attr-defined]
        src = self.source
        #: requests join as workload rows (see advance), where a preemption by recompute of
        #: the last admitted (``KVPreemption._recompute_newest``) takes them as rows too
        self.light = (not src._attrs and policy.victim_rule == "last_admitted"  # type: ignore[attr-defined]
                      and type(policy)._recompute_newest is RECOMPUTE_NEWEST
                      and self.rec.set_row_source(src, src._arrival, src._prompt, src._output))
        self._admit_at = self._admission(policy, self.light)

    def advance(self, busy: float) -> tuple[float, float]:
        """:meth:`FcfsDecodeLoop.advance` with memory; the members that joined here as rows
        ``[index, first scheduled, first token, slot, finish step]`` (``light``) become
        requests when it stops (:meth:`_to_requests`), and so do rows preempted in it and
        waiting in front of the queue."""
        try:
            return FcfsDecodeLoop.advance(self, busy)
        finally:
            if self.light:
                self._to_requests()

    def _advance(self, busy: float, runs: list[tuple[float, int, int, int]]
                 ) -> tuple[float, float]:
        """:meth:`FcfsDecodeLoop.advance` with memory: each boundary's round and admission
        (the policy's ``_prepare`` and ``admit``), runs as ``decode_run`` offers them, each
        run's rounds and memory rows (``complete_run``) and its finishers' blocks freed."""
        env = self.env
        queue = env._queue
        ctx = self.ctx
        policy: Any = self.policy
        batch = self.batch
        heap = batch._heap
        members = batch._members
        free_slots = batch._free_slots
        src = self.source
        backlog: Any = ctx.waiting
        head = backlog._head
        arrival, prompt, output = src._arrival, src._prompt, src._output
        n = src._n
        rec = self.rec
        done = rec._done
        done_row = done.append
        slots = ctx.slots
        cap = slots.capacity
        max_batch = policy.params.max_batch
        coefs = self._coef
        run_ends = self._run_ends
        queued_by = src.queued_by  # (FcfsDecodeLoop._queued: the source's count)
        t1_col, waiting_col = rec._t1, rec._waiting
        run_row = runs.append
        buf_cap = rec._buf_cap
        engine = self.engine
        kv = self.kv
        alloc = kv.alloc
        held = alloc.held
        internal = alloc._internal
        series = kv.series
        # the memory series' raw lists, extended in place (KVSeries.add_run); none: scratch
        kv_t1, alloc_col, int_col, t0_col, run_col = (
            (series._t1, series._alloc, series._int, series._t0, series._runs)
            if series is not None else ([], [], [], [], []))
        run_t0 = t0_col.append
        alloc_add = alloc_col.append
        kv_bs = kv.block_size
        num_blocks = alloc.capacity_units
        growth = self.growth
        phases, bs, ring = growth.phases, growth.bs, growth.ring
        ring_len = len(ring)
        covered, grow_events, grow_plan = growth.covered, growth._events, growth._plan
        admit_at = self._admit_at
        keep_free = policy.keep_free
        max_len = policy._max_len
        refused_again = policy._refused_again
        # (nothing is padded in a paged pool, nor swapped while the loop runs)
        pad, swapped = alloc.padding_slots, kv.num_swap_blocks_used * kv_bs
        extra_itl = rec._extra_itl.append
        swap = policy.swap
        grow_exact = policy._grow_exact
        grow_due = growth.grow_due
        take = policy._recompute_newest() if self.light else None  # (rows stay rows)
        inf = float("inf")
        t0 = -1.0
        while True:
            now = env._now
            # the arrivals due by now join the backlog (ctx.poll_arrivals)
            i = src._next
            if i < n and arrival[i] <= now:
                j = i + 1
                while j < n and arrival[j] <= now:
                    j += 1
                src._next = backlog._hi = j
                rec.num_arrived += j - i
            # the boundary's growth (KVDecodePolicy._prepare); short of blocks, member by
            # member, preempting by recompute (a swap's time goes to the engine's step)
            step = batch.num_steps
            if step != growth.last_round:
                due = len(phases[step % bs])
                if due > alloc.num_free_blocks:
                    if swap:
                        return t0, busy
                    if take is None:
                        grow_exact(growth.round(step))
                    else:  # (DecodeGrowth.round, KVPreemption._grow_exact: its defaults)
                        growth.last_round = step
                        grow_due(phases[step % bs], take)
                        growth.end_round(step)
                else:  # (DecodeGrowth.round: the free blocks cover it)
                    growth.last_round = step
                    alloc.num_free_blocks -= due
                    if (grow_events and grow_events[0][0] <= step) or growth._early:
                        growth.end_round(step)
            policy._blocked = False
            if (head or backlog._hi > backlog._lo) and slots.count < cap:
                if head:  # (KVDecodePolicy.ready_plan, KVAdmission.admit_fcfs)
                    first = head[0]  # a request put back (refused, preempted)
                    miss = policy._miss
                    keep = keep_free if batch.size else 0
                    if miss is not None and first is miss[0]:
                        if refused_again(miss, keep):
                            policy._blocked = True  # the head is refused again
                    else:
                        if type(first) is list:  # a preempted row
                            k = first[0]
                            p, o, out = prompt[k], output[k], first[5]
                        else:
                            p, o, out = first.prompt_len, first.output_len, first.num_output_tokens
                        p = p if p > 0 else 1
                        need = -(-(p + out) // bs)
                        if ((max_len is None or p + o <= max_len)
                                and need + keep > alloc.num_free_blocks and need <= num_blocks):
                            policy._blocked = True  # refused for now (try_join)
                            policy._miss = (first, need, 0, 0)
                if not policy._blocked and not admit_at(now, step):
                    return t0, busy  # (something else takes part: the policy's own path)
            size = batch.size
            if not size:
                return t0, busy
            # how long the batch runs (KVDecodeRuns.decode_run; one step where it offers none)
            while members.get(heap[0][1]) is not heap[0][2]:  # (DecodeBatch.drop_removed)
                heappop(heap)
            max_steps = heap[0][0] - step
            room = False
            if max_steps > 1:
                free = alloc.num_free_blocks  # (DecodeGrowth.covered: at once where the free
                if growth._early or len(phases[(step + 1) % bs]) > free:  # blocks cover every
                    max_steps = 1  # growth; none where they do not cover the next round)
                elif free < len(grow_plan) * ((max_steps - 1) // bs + 1):
                    a = (step + 1) % bs  # round by round: the rounds are a slice of the ring
                    if a + max_steps - 1 <= ring_len:
                        for r in range(a, a + max_steps - 1):
                            free -= len(ring[r])
                            if free < 0:
                                max_steps = r - a + 1  # (the rounds before r are covered)
                                break
                    else:
                        max_steps = covered(step, max_steps - 1) + 1
                if max_steps > 1:
                    open_slot = slots.count < slots.capacity
                    if policy._blocked:  # the head was refused: it is at every boundary
                        if not open_slot:
                            max_steps = 1
                    elif open_slot and (head or backlog._hi > backlog._lo):
                        max_steps = 1  # (not tried at this boundary)
                    else:
                        room = size < max_batch  # (Continuous.has_room)
            # the run's step ends (Engine._run_ends) and queue lengths (queued_by)
            kv_tokens = batch.num_kv_tokens
            coef = coefs.get(size)
            if coef is None:
                coef = coefs[size] = self._step_of(size)
            limit = inf
            if room and max_steps > 1:  # the run ends at the first step ending at or after
                limit = arrival[src._next] if src._next < n else inf  # the next arrival
            timed = run_ends(coef, now, kv_tokens, size, max_steps, limit, busy)
            if timed is None:
                return t0, busy  # (the engine reports the step time)
            ends, run_busy = timed
            t = ends[-1]
            if queue and queue[0][0] <= t:  # something else is due first: the engine waits
                return t0, busy
            steps = len(ends)
            waits = queued_by(len(head) + backlog._hi - backlog._lo, ends)
            ctx.busy_until = env._now = t
            t0 = now
            busy = run_busy
            # the run's rounds and memory rows (KVDecodeRuns.complete_run, DecodeGrowth.run_rounds)
            used = num_blocks - alloc.num_free_blocks
            last = step + steps - 1
            if growth._early:
                try:  # (members that joined before their round ran: the growth's own rounds)
                    allocated, internals = growth.run_rounds(step, steps - 1)
                except ValueError as err:
                    raise SimulationError(f"a run of decode steps: {err}") from None
                alloc_col += allocated
                int_col += internals
                peak = allocated[-1]
                unit = 1
            else:  # each step's allocated blocks and internal slots go straight to the
                unit = bs  # series' lists (its allocated slots: blocks in the run's unit)
                alloc_add(used)
                if steps > 1:
                    a = (step + 1) % bs  # (rounds step + 1 to last: a slice of the ring)
                    for ph in (ring[a:a + steps - 1] if a + steps <= ring_len else
                                (phases[r % bs] for r in range(step + 1, last + 1))):
                        used += len(ph)
                        alloc_add(used)
                    if used > num_blocks:  # (covered: never)
                        raise SimulationError(f"a run of decode steps: rounds {step + 1} to "
                                              f"{last} need more blocks than are free")
                    alloc.num_free_blocks = num_blocks - used
                    growth.last_round = last
                peak = used * bs  # (allocated only grows in a run)
                slots_int = alloc.internal_slots
                if grow_events and grow_events[0][0] <= last:  # members take their final
                    at = step  # blocks (DecodeGrowth.end_round): internal slots from then
                    while grow_events and grow_events[0][0] <= last:
                        r, seq, k = heappop(grow_events)
                        g = grow_plan.get(k)
                        if g is not None and g[3] == seq:
                            int_col += [slots_int] * (r - at)
                            at = r
                            internal[k] = tail = g[4]
                            slots_int += tail
                    int_col += [slots_int] * (last + 1 - at)
                    alloc.internal_slots = slots_int
                else:
                    int_col += [slots_int] * steps
            if series is not None:  # (KVPool.observe_run, KVSeries.add_run)
                if peak > kv.peak_allocated:
                    kv.peak_allocated = peak
                kv_t1 += ends
                run_t0(now)
                run_col.extend((steps, kv_tokens, size, pad, swapped, policy._blocked, unit))
                if len(kv_t1) >= KV_BUFFER:
                    series.flush(whole=True)
            else:
                del alloc_col[:], int_col[:]
            # the run's effects (DecodeOnlyPolicy._complete): first tokens, then the members
            # that finish in its last step leave (DecodeBatch.advance), free their blocks
            # (KVDecodePolicy.finished) and end (SchedulerContext.finish_all)
            itl = size
            joined = policy._joined
            if joined:
                t_first = ends[0]
                for m in joined:
                    if type(m) is list:
                        if m[2] is None:
                            m[2] = t_first
                        else:  # a preempted row resumed: its own gap (Recorder.record_itl)
                            extra_itl((t_first - m[7], 1, rec._steps_flushed + len(t1_col)))
                    elif m.first_token is None:
                        m.first_token = t_first
                    else:  # resumed after a preemption: its own gap
                        rec.record_itl(t_first - m.last_token)
                itl = size - len(joined)
                policy._joined = []
            if policy._swapped_in:
                policy._swapped_in = []
            step += steps
            batch.num_steps = step
            kv_left = kv_tokens + size * steps
            left = size
            freed = freed_int = 0  # blocks and internal slots given back
            while heap and heap[0][0] == step:
                _, seq, m = heappop(heap)
                if members.pop(seq, None) is None:  # removed earlier
                    continue
                if type(m) is list:  # (the row: index, first scheduled, first token, finish)
                    k = m[0]
                    kv_left -= prompt[k] + output[k]
                    heappush(free_slots, m[3])
                    m[3] = t
                else:
                    m.num_output_tokens = out = m.output_len
                    m._batch_seq = -1
                    kv_left -= m.prompt_len + out
                    heappush(free_slots, m.slot)
                    m.slot = -1
                    m.state = FINISHED
                    m.finish = m.last_token = t
                    k = m.id
                freed_int += internal.pop(k, 0)  # (KVPool.release)
                g = grow_plan.pop(k, None)
                if g is None:
                    freed += held.pop(k)
                else:  # it grew (DecodeGrowth.leave), to its final block before its last step
                    phases[g[1] % bs].pop(g[3], None)
                    del held[k]
                    freed += g[0] + g[2]
                done_row(m)
                left -= 1
            if left != size:
                alloc.num_free_blocks += freed
                alloc.internal_slots -= freed_int
                kv.num_releases += size - left
                slots.count -= size - left
                batch.size = left
                if len(done) >= DONE_BLOCK:
                    rec._write_done()
            batch.num_kv_tokens = kv_left
            ctx.last_step_end = t
            # the run's steps (Recorder.record_run)
            t1_col.fromlist(ends)
            waiting_col.fromlist(waits)
            run_row((now, steps, size, itl))
            if len(t1_col) >= buf_cap:
                rec.record_decode_runs(runs)
                runs.clear()
                rec._flush()
            engine.busy_time = busy
