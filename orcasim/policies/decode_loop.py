"""Runs of a first-come-first-served decode batch, one after another, in one loop.

At every step boundary, ``continuous`` without KV memory limits on a lazy
open-loop source takes the arrivals due, tops its batch up from the
backlog's head, runs the batch unchanged until a member finishes (or an
arrival could join) and records the finishers and the steps.
:class:`FcfsDecodeLoop` does that for run after run in one frame, reading and
writing the policy's, batch's, source's and recorder's state directly, while
nothing else is due in SimPy's queue before a run's end (else the engine takes
the boundary), with the policy's and recorder's effects bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from orcasim.batch import DecodeBatch
from orcasim.metrics.request_rows import DONE_BLOCK, RequestRows
from orcasim.request import Request, RequestState
from orcasim.source import Backlog, OpenLoopSource

if TYPE_CHECKING:
    from orcasim.engine import Engine

RUNNING = RequestState.RUNNING
FINISHED = RequestState.FINISHED

class FcfsDecodeLoop:
    """Whole runs of an unlimited first-come-first-served decode batch (see the module)."""

    #: off: the engine takes every run through the policy's and recorder's methods
    enabled = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.env = engine.env
        self.ctx = ctx = engine.ctx
        self.policy = policy = engine.policy
        self.batch = policy.batch  # type: ignore[attr-defined]
        self.source: OpenLoopSource = ctx.source  # type: ignore[assignment]
        self.rec = ctx.recorder
        #: by batch size: how a decode step is timed (see _step_of)
        self._coef: dict[int, tuple[float, float] | Callable[[int], float]] = {}
        src = self.source
        #: requests join as workload rows, not objects (see advance)
        self.light = not src._attrs and self.rec.set_row_source(src, src._arrival, src._prompt,
                                                                src._output)

    @classmethod
    def applies(cls, engine: Engine) -> bool:
        """Whether ``engine`` may take its runs through this loop: a policy that fills its
        batch first come first served at every boundary without memory limits, prefill
        charging or processes, fed by a lazy open-loop source."""
        from orcasim.policies.base import DecodeOnlyPolicy
        from orcasim.policies.continuous import Continuous
        from orcasim.policies.runs import DecodeRuns

        policy: Any = engine.policy
        ctx = engine.ctx
        kind = type(policy)
        own = all(getattr(getattr(policy, name, None), "__func__", None) is func for name, func in (
            ("ready_plan", DecodeOnlyPolicy.ready_plan), ("finished", DecodeOnlyPolicy.finished),
            ("decode_run", DecodeRuns.decode_run), ("complete_run", DecodeRuns.complete_run),
            ("join", DecodeOnlyPolicy.join)))
        return (cls.enabled and own and kind.admit is Continuous.admit
                and kind.has_room is Continuous.has_room and type(policy.batch) is DecodeBatch
                and kind._complete is DecodeOnlyPolicy._complete and policy._runs
                and not policy._listens and not policy.prefill
                and getattr(policy, "kv", None) is None
                and type(ctx.source) is OpenLoopSource and ctx.source.lazy
                and type(ctx.waiting) is Backlog)

    def ready(self) -> bool:
        """Whether nothing outside the loop acts at a boundary now: no admission gate,
        clients, step-end, arrival or admission listener, end or admit callback, slot waiter
        or reservation, deferred joiner, and the recorder's methods are its own."""
        ctx = self.ctx
        slots = ctx.slots
        rec = self.rec
        policy: Any = self.policy
        return (ctx.gate is None and ctx.clients is None and ctx._step_end is None
                and ctx._arrival is None and ctx._admitted is None and ctx.on_end is None
                and ctx.on_admit is None and not slots._getters and slots._freed is None
                and not slots.reserved and not policy._deferred
                and type(ctx.source) is OpenLoopSource and ctx.source.lazy
                and ctx.waiting is self.source._backlog
                and "record_request" not in rec.__dict__
                and type(rec).record_request is RequestRows.record_request
                and "record_run" not in rec.__dict__)

    def advance(self, busy: float) -> tuple[float, float]:
        """Run whole runs from the boundary at the clock's time while nothing else is due.

        Stops at a boundary (its arrivals and admissions done) where the batch
        is empty, or where SimPy's queue holds something due before the end of
        the run the batch would make: the engine then plans that boundary as
        usual (finding the same plan) and waits for the run's end. Returns the
        start of the last run made (-1.0: none) and the engine's busy time.

        A request that joins here is a list ``[index, first scheduled, first
        token, slot]`` in the batch, not a :class:`~orcasim.request.Request`
        (the workload's columns hold the rest), and leaves the recorder a row
        ``[index, first scheduled, first token, finish]``; the members still
        running when the loop stops become requests (:meth:`_to_requests`).
        Requests already in the batch or put back into the queue, and every
        request of a workload with per-request attributes, stay requests.
        """
        runs: list[tuple[float, int, int, int]] = []  # run rows not yet given to the recorder
        try:
            return self._advance(busy, runs)
        finally:
            if runs:
                self.rec.record_decode_runs(runs)

    def _advance(self, busy: float, runs: list[tuple[float, int, int, int]]
                 ) -> tuple[float, float]:
        """:meth:`advance`, holding each run's row in ``runs`` (its steps' ends and queue
        lengths go to the recorder at once)."""
        env = self.env
        queue = env._queue
        ctx = self.ctx
        policy: Any = self.policy
        batch = self.batch
        heap = batch._heap
        members = batch._members
        free_slots = batch._free_slots
        src = self.source
        backlog: Backlog = ctx.waiting
        head = backlog._head
        arrival, prompt, output = src._arrival, src._prompt, src._output
        n = src._n
        light = self.light
        make = src._request
        rec = self.rec
        done = rec._done
        done_row = done.append
        slots = ctx.slots
        cap = slots.capacity
        max_batch = policy.params.max_batch
        coefs = self._coef
        run_ends = self._run_ends
        queued = self._queued
        t1_col, waiting_col = rec._t1, rec._waiting
        run_row = runs.append
        buf_cap = rec._buf_cap
        engine = self.engine
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
            # the batch is topped up from the backlog's head (Continuous.admit, ctx.admit,
            # DecodeBatch.add)
            size = batch.size
            room = max_batch - size
            joined = policy._joined
            if room > 0 and (head or backlog._hi > backlog._lo):
                busy_until = ctx.busy_until
                start = now if busy_until <= now else busy_until
                started = kv_added = 0
                steps_done = batch.num_steps
                while room:
                    seq = batch._next_seq
                    slot = free_slots[0] if free_slots else batch._next_slot
                    if light and not head:
                        k = backlog._lo
                        if k >= backlog._hi:
                            break
                        backlog._lo = k + 1
                        if slots.count >= cap:
                            slots.admit(make(k, arrival[k]))  # (raises: every slot is taken)
                        slots.count += 1
                        remaining = output[k]
                        if remaining <= 0:
                            batch.add(make(k, arrival[k]))  # (raises: nothing to generate)
                        m: Any = [k, start, None, slot]
                        kv_added += prompt[k]
                        started += 1
                    else:
                        if head:
                            m = head.popleft()
                        else:
                            k = backlog._lo
                            if k >= backlog._hi:
                                break
                            backlog._lo = k + 1
                            m = make(k, arrival[k])
                        if m.state != RUNNING:
                            if slots.count >= cap:
                                slots.admit(m)  # (raises)
                            slots.count += 1
                            m.state = RUNNING
                        if m.first_scheduled is None:
                            m.first_scheduled = start
                            started += 1
                        remaining = m.output_len - m.num_output_tokens
                        if remaining <= 0:
                            batch.add(m)  # (raises)
                        m._batch_seq = seq
                        m._done_at = steps_done + remaining
                        m.slot = slot
                        kv_added += m.prompt_len + m.num_output_tokens
                    batch._next_seq = seq + 1
                    if free_slots:
                        heappop(free_slots)
                    else:
                        batch._next_slot = slot + 1
                    heappush(heap, (steps_done + remaining, seq, m))
                    members[seq] = m
                    joined.append(m)
                    room -= 1
                ctx.num_started += started
                size = max_batch - room
                batch.size = size
                batch.num_kv_tokens += kv_added
            if not size:
                return t0, busy
            # the run: its step ends (Engine._run_ends) and queue lengths (queued_by)
            kv = batch.num_kv_tokens
            coef = coefs.get(size)
            if coef is None:
                coef = coefs[size] = self._step_of(size)
            max_steps = heap[0][0] - batch.num_steps
            limit = inf
            if room and max_steps > 1:  # the run ends at the first step ending at or after
                limit = arrival[src._next] if src._next < n else inf  # the next arrival
            timed = run_ends(coef, now, kv, size, max_steps, limit, busy)
            if timed is None:
                self._to_requests()
                return t0, busy  # (the engine reports the step time)
            ends, run_busy = timed
            t = ends[-1]
            if queue and queue[0][0] <= t:  # something else is due first: the engine waits
                self._to_requests()
                return t0, busy
            steps = len(ends)
            waits = queued(ends, len(head) + backlog._hi - backlog._lo)
            ctx.busy_until = env._now = t
            t0 = now
            busy = run_busy
            # the run's effects (DecodeOnlyPolicy._complete): first tokens, then the members
            # that finish in its last step leave (DecodeBatch.advance) and end
            # (SchedulerContext.finish_all), in the order they joined
            itl = size
            if joined:
                t_first = ends[0]
                for m in joined:
                    if type(m) is list:
                        m[2] = t_first
                    elif m.first_token is None:
                        m.first_token = t_first
                    else:  # resumed after a preemption: its own gap
                        rec.record_itl(t_first - m.last_token)
                itl = size - len(joined)
                policy._joined = []
            step = batch.num_steps + steps
            batch.num_steps = step
            kv_left = kv + size * steps
            left = size
            while heap and heap[0][0] == step:
                _, seq, m = heappop(heap)
                if type(m) is list:
                    del members[seq]
                    k = m[0]
                    kv_left -= prompt[k] + output[k]
                    heappush(free_slots, m[3])
                    m[3] = t  # (the row: index, first scheduled, first token, finish)
                    done_row(m)
                elif m._batch_seq == seq:  # (else removed earlier)
                    m.num_output_tokens = out = m.output_len
                    del members[seq]
                    m._batch_seq = -1
                    kv_left -= m.prompt_len + out
                    heappush(free_slots, m.slot)
                    m.slot = -1
                    m.state = FINISHED
                    m.finish = m.last_token = t
                    done_row(m)
                else:
                    continue
                left -= 1
            if left != size:
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

    def _step_of(self, size: int) -> tuple[float, float] | Callable[[int], float]:
        """How a decode step of ``size`` sequences is timed from its KV tokens, as the engine
        times a run's steps: ``(a, c)`` for ``a + c * kv``, or a function of ``kv``."""
        lat = self.engine.latency
        coef = lat.decode_coefficients(size)
        if coef is not None and coef[0] > 0.0:
            return coef
        step = lat.decode_step(size)
        return self.engine._plan_step(size) if step is None else step

    @staticmethod
    def _run_ends(step: tuple[float, float] | Callable[[int], float], now: float, kv: int,
                  size: int, max_steps: int, limit: float, busy: float
                  ) -> tuple[list[float], float] | None:
        """A run's step ends from ``now`` and the busy time after it (``Engine._run_ends``),
        each step timed by ``step`` (see :meth:`_step_of`); ``None`` if one takes no time."""
        if type(step) is tuple:  # a + c * kv, a > 0 (a linear model)
            a, c = step
            dt = a + c * kv
            if not dt > 0.0:
                return None
            t = now + dt
            busy += dt
            ends = [t]
            if max_steps > 1 and t < limit:
                append = ends.append
                if limit == float("inf"):  # every step up to the first finish
                    for x in range(kv + size, kv + size * max_steps, size):
                        d = a + c * x
                        t += d
                        busy += d
                        append(t)
                else:
                    for x in range(kv + size, kv + size * max_steps, size):
                        d = a + c * x
                        t += d
                        busy += d
                        append(t)
                        if t >= limit:
                            break
            return ends, busy
        dt = step(kv)
        if not dt > 0.0:
            return None
        t = now + dt
        busy += dt
        ends = [t]
        if max_steps > 1 and t < limit:
            for x in range(kv + size, kv + size * max_steps, size):
                d = step(x)
                if not d > 0.0:
                    return None
                t += d
                busy += d
                ends.append(t)
                if t >= limit:
                    break
        return ends, busy

    def _queued(self, ends: list[float], num_waiting: int) -> list[int]:
        """The queue's length at each of a run's step starts (``OpenLoopSource.queued_by``)."""
        return self.source.queued_by(num_waiting, ends)

    def _to_requests(self) -> None:
        """The batch's members that joined here become :class:`~orcasim.request.Request`
        objects, as the policy's own steps would have them."""
        members, heap, src = self.batch._members, self.batch._heap, self.source
        made: dict[int, Request] = {}  # by the id of the list it replaces
        for at, (done_at, seq, m) in enumerate(heap):
            if type(m) is list and members.get(seq) is m:
                req = src.running_request(*m, seq, done_at)
                made[id(m)] = members[seq] = req
                heap[at] = (done_at, seq, req)
        if made:
            self.policy._joined = [made.get(id(m), m) for m in self.policy._joined]  # type: ignore[attr-defined]
