"""Request sources: SimPy processes that release a workload's requests into the waiting queue.

:class:`OpenLoopSource` releases every request at its arrival time.
:class:`ChainedSource` also releases requests that wait for another one to
end (closed-loop clients, the next turn of a conversation): see
:func:`make_source`, which picks the source a workload needs.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import simpy

from orcasim.backlog import Backlog
from orcasim.context import SchedulerContext
from orcasim.request import Request, RequestState
from orcasim.workload.base import WorkloadArrays


def delay_until(now: float, t: float) -> float:
    """A delay ``d >= 0`` with ``now + d == t`` exactly in floating point, when one exists.

    ``t - now`` alone can be off by one unit in the last place, which would
    make a request arrive a hair after its recorded arrival time.
    """
    d = t - now
    if d <= 0:
        return 0.0
    for _ in range(64):
        s = now + d
        if s == t:
            break
        d = math.nextafter(d, math.inf if s < t else 0.0)
    return d


def column_view(col: Any) -> Sequence[Any]:
    """``col`` read element by element as Python numbers, without a copy where it can be.

    A numeric numpy column becomes a read-only memoryview of its buffer: indexing
    gives the same ``float``/``int`` as ``tolist()`` would, while a list of ten
    million floats costs about 320 MB beside the array it is made from. Other
    columns (strings, lists of block ids) become lists.
    """
    if (isinstance(col, np.ndarray) and col.ndim == 1 and col.dtype.kind in "fiub"
            and col.dtype.isnative):
        return memoryview(np.ascontiguousarray(col)).toreadonly()
    return col.tolist() if hasattr(col, "tolist") else list(col)


class ArrivalSource:
    """What a context and its engine read of the source of arrivals (``ctx.source``).

    The defaults describe a source that submits each request as it comes and
    has nothing scheduled ahead: :class:`OpenLoopSource` overrides them; the
    API server, a cluster replica's view of the router and ``orcasim serve``'s
    live source keep most of them.
    """

    #: released lazily into ``ctx.waiting`` (a :class:`Backlog`), see
    #: :meth:`OpenLoopSource.release_lazily`
    lazy = False

    @property
    def exhausted(self) -> bool:
        """No request will arrive any more."""
        raise NotImplementedError

    def pending_until(self, now: float) -> bool:
        """Whether a request due by ``now`` has not been submitted yet."""
        return False

    def flush(self, now: float) -> None:
        """Submit every request due by ``now``."""
        return None

    def next_arrival(self) -> float | None:
        """When the next request arrives, if known ahead."""
        return None


class OpenLoopSource(ArrivalSource):
    """Releases the workload's requests into ``ctx`` at their arrival times.

    Requests are created only when they arrive, so a long workload costs three
    numbers per request until then. Requests with the same arrival time are
    released together.

    After :meth:`release_lazily` (for a policy that polls arrivals at every
    step boundary and waits for ``ctx.arrival`` only when idle), the clock
    wakes the source only while someone waits for an arrival, and released
    requests wait in a :class:`Backlog` until the policy takes them.
    """

    def __init__(self, env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays):
        self.env = env
        self.ctx = ctx
        self._arrival: Sequence[float] = column_view(arrays.arrival)
        self._prompt: Sequence[int] = column_view(arrays.prompt_len)
        self._output: Sequence[int] = column_view(arrays.output_len)
        self._attrs = [(key, column_view(col)) for key, col in arrays.attrs.items()]
        self._next = 0
        self._n = len(self._arrival)
        self._armed: simpy.Event | None = None  # what a lazy source sleeps on
        self._backlog: Any = None  # a Backlog, or the policy's queue (release_lazily)
        self._floors: dict[str, Any] = {}
        ctx.source = self
        self.process = env.process(self.run())

    def release_lazily(self) -> None:
        """Release into a :class:`Backlog` at step boundaries; wake only for a waiting policy.

        Only for a policy that calls ``ctx.poll_arrivals()`` at every step
        boundary and otherwise waits on ``ctx.arrival``, with no admission
        gate or clients (they act at each arrival). ``ctx.waiting`` must be
        empty: a deque, which becomes the backlog, or a policy's queue that takes
        releases itself (:class:`~orcasim.policies.queues.Released`).
        """
        ctx = self.ctx
        waiting: Any = ctx.waiting
        if waiting or not (type(waiting) is deque or getattr(waiting, "takes_releases", False)):
            raise ValueError("a lazy source needs an empty waiting queue that takes releases")
        backlog = Backlog(self)
        backlog._lo = backlog._hi = self._next
        if type(waiting) is deque:
            self._backlog = ctx.waiting = backlog
        else:  # the queue takes what the backlog releases
            self._backlog = waiting.attach(backlog)
        self.lazy = True

    def least_ahead(self, attr: str, default: Any) -> Any:
        """The least ``attr`` of the requests still to arrive, a bound on every later arrival
        (``default``: the workload has no such column; ``None``: nobody is left)."""
        if attr not in self._floors:  # suffix minima
            col = dict(self._attrs).get(attr)
            self._floors[attr] = None if col is None else column_view(
                np.minimum.accumulate(np.asarray(col)[::-1])[::-1])
        floors = self._floors[attr]
        return None if self._next >= self._n else default if floors is None else floors[self._next]

    def release_eagerly(self) -> None:
        """Back to submitting every request at its arrival time (e.g. after a hard stop)."""
        self.lazy = False
        self._backlog = None
        self.arm()

    def arm(self) -> None:
        """Someone waits for an arrival: a sleeping lazy source wakes at the next one."""
        ev = self._armed
        if ev is not None and not ev.triggered:
            ev.succeed()

    @property
    def exhausted(self) -> bool:
        return self._next >= self._n

    def pending_until(self, now: float) -> bool:
        """True if a request with arrival time <= ``now`` has not been submitted yet."""
        i = self._next
        return i < self._n and self._arrival[i] <= now

    def flush(self, now: float) -> None:
        """Submit every request with arrival time <= ``now`` that is not yet submitted."""
        i, n, arrival = self._next, self._n, self._arrival
        backlog = self._backlog
        if backlog is not None:
            while i < n and arrival[i] <= now:
                i += 1
            count = i - self._next
            self._next = i
            backlog.release(i)
            self.ctx.released(count)
            return
        submit = self.ctx.submit
        while i < n and arrival[i] <= now:
            req = self._request(i, arrival[i])
            i += 1
            self._next = i
            submit(req)

    def _request(self, i: int, t: float) -> Request:
        """Request ``i`` of the workload, arriving at ``t``."""
        req = Request(i, t, self._prompt[i], self._output[i])
        for key, col in self._attrs:
            setattr(req, key, col[i])
        return req

    def running_request(self, i: int, first_scheduled: float, first_token: float, slot: int,
                        seq: int, done_at: int) -> Request:
        """Request ``i`` as a running member of a decode batch (member ``seq`` in ``slot``, its
        last token due at step ``done_at``): what a loop that held it as a workload row hands
        back to the policy."""
        req = self._request(i, self._arrival[i])
        req.state = RequestState.RUNNING
        req.first_scheduled = first_scheduled
        req.first_token = first_token
        req._batch_seq = seq
        req._done_at = done_at
        req.slot = slot
        return req

    def next_arrival(self) -> float | None:
        """Arrival time of the next request released by the clock (``None``: none left)."""
        return self._arrival[self._next] if self._next < self._n else None

    def queued_by(self, num_waiting: int, ends: list[float]) -> list[int]:
        """Queue lengths at the start of each step of a run that starts now and ends at ``ends``.

        The first step starts with ``num_waiting`` queued; each later one also
        counts the requests released by the end of the step before (every
        arrival queues: no admission gate, and nobody joins mid-run).
        """
        arrival, n = self._arrival, self._n
        j = self._next
        w = num_waiting
        out = [w]
        if len(ends) > 1 and j < n and arrival[j] <= ends[-2]:
            for t in ends[:-1]:
                while j < n and arrival[j] <= t:
                    j += 1
                    w += 1
                out.append(w)
        else:
            out *= len(ends)
        return out

    def run(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        ctx = self.ctx
        while (t := self.next_arrival()) is not None:
            if self.lazy and ctx._arrival is None:  # nobody waits: sleep until someone does
                self._armed = env.event()
                yield self._armed
                self._armed = None
                continue
            if t > env.now:
                yield env.timeout(delay_until(env.now, t))
            self.flush(env.now)


class ChainedSource(OpenLoopSource):
    """Open-loop requests at their arrival times, and chained ones after a think time.

    Request ``i`` with ``arrays.after[i] = j >= 0`` is released
    ``arrays.think[i]`` seconds after request ``j`` reaches its final state
    (finished, rejected or aborted: a client goes on either way). Its arrival
    time is that release time. The ends are reported through
    :attr:`SchedulerContext.on_end`; each release is one timer event, so a
    chain costs one event per request, like an open-loop arrival.
    """

    def __init__(self, env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays):
        assert arrays.after is not None and arrays.think is not None
        after = arrays.after.tolist()
        self._roots = [i for i, a in enumerate(after) if a < 0]
        self._root_time = [float(arrays.arrival[i]) for i in self._roots]
        self._next_of = [-1] * len(after)
        for i, a in enumerate(after):
            if a >= 0:
                self._next_of[a] = i
        self._think: list[float] = arrays.think.tolist()
        self._due: list[tuple[float, int]] = []  # (release time, index) of chained requests
        self._next_root = 0
        self._submitted = 0
        super().__init__(env, ctx, arrays)
        ctx.on_end = self._on_end

    @property
    def exhausted(self) -> bool:
        return self._submitted >= self._n

    def pending_until(self, now: float) -> bool:
        t = self.next_arrival()
        if t is not None and t <= now:
            return True
        return bool(self._due) and self._due[0][0] <= now

    def flush(self, now: float) -> None:
        """Submit every request due by ``now``, by release time, then workload order."""
        ready: list[tuple[float, int]] = []
        k, roots, times = self._next_root, self._roots, self._root_time
        while k < len(roots) and times[k] <= now:
            ready.append((times[k], roots[k]))
            k += 1
        self._next_root = k
        due = self._due
        while due and due[0][0] <= now:
            ready.append(heapq.heappop(due))
        ready.sort()
        submit = self.ctx.submit
        for t, i in ready:
            self._submitted += 1
            submit(self._request(i, t))

    def _on_end(self, req: Request) -> None:
        nxt = self._next_of[req.id]
        if nxt < 0:
            return
        now = self.env.now
        t = now + self._think[nxt]
        heapq.heappush(self._due, (t, nxt))
        self.env.timeout(delay_until(now, t)).callbacks.append(self._release)

    def _release(self, _event: simpy.Event) -> None:
        if self.pending_until(self.env.now):
            self.flush(self.env.now)

    def next_arrival(self) -> float | None:
        k = self._next_root
        return self._root_time[k] if k < len(self._roots) else None


def make_source(env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays
                ) -> OpenLoopSource:
    """The source ``arrays`` needs: its own release rule (``arrays.release``), chained if
    some requests wait for others, else open-loop."""
    if arrays.release is not None:
        return arrays.release.source(env, ctx, arrays)
    if arrays.after is not None and bool((arrays.after >= 0).any()):
        return ChainedSource(env, ctx, arrays)
    return OpenLoopSource(env, ctx, arrays)
