"""The scheduler context: everything a policy sees, in one small object.

A policy reads the clock, the waiting queue, the arrival event and (with a
``memory`` section) the KV pool ``kv`` here, and
moves requests through their life cycle with :meth:`admit`,
:meth:`first_token`, :meth:`finish`, :meth:`reject` and :meth:`abort`, which
keep the request's timestamps and the recorder consistent. The arrival event
is created only when a policy waits on it, so an arrival costs nothing when
the engine is busy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.kv.pool import KVPool
    from orcasim.metrics.recorder import Recorder
    from orcasim.source import OpenLoopSource


class SchedulerContext:
    """The clock, the waiting queue and the life-cycle operations of one engine."""

    def __init__(self, env: simpy.Environment, recorder: Recorder) -> None:
        self.env = env
        self.recorder = recorder
        self.waiting: deque[Request] = deque()
        self.source: OpenLoopSource | None = None
        self.last_step_end = 0.0  # end time of the engine's most recent step
        #: called with each request as it reaches its final state (closed-loop sources)
        self.on_end: Callable[[Request], None] | None = None
        self.kv: KVPool | None = None  # KV memory, when the scenario has a memory section
        self._arrival: simpy.Event | None = None

    @property
    def now(self) -> float:
        return self.env.now

    @property
    def arrival(self) -> simpy.Event:
        """An event that fires at the next arrival (a fresh one after each arrival)."""
        ev = self._arrival
        if ev is None:
            ev = self._arrival = self.env.event()
        return ev

    @property
    def arrivals_done(self) -> bool:
        """True once no more requests will arrive."""
        return self.source is None or self.source.exhausted

    def poll_arrivals(self) -> None:
        """Deliver every request whose arrival time is <= now.

        Policies call this at a step boundary so that a request arriving at
        exactly the boundary is seen by it, whatever the order in which the
        simulator processes simultaneous events.
        """
        src = self.source
        if src is not None and src.pending_until(self.env.now):
            src.flush(self.env.now)

    def submit(self, req: Request) -> None:
        """A request arrives: queue it and wake a policy waiting for arrivals."""
        self.recorder.num_arrived += 1
        self.waiting.append(req)
        ev = self._arrival
        if ev is not None:
            self._arrival = None
            ev.succeed()

    def admit(self, req: Request) -> None:
        """``req`` joins the running batch now."""
        req.state = RequestState.RUNNING
        if req.first_scheduled is None:
            req.first_scheduled = self.env.now

    def finish(self, req: Request, t: float) -> None:
        """``req`` emitted its last token at ``t``."""
        req.state = RequestState.FINISHED
        req.finish = req.last_token = t
        self._ended(req)

    def reject(self, req: Request, reason: str) -> None:
        """``req`` is turned away without running (admission control, capacity)."""
        req.state = RequestState.REJECTED
        req.reason = reason
        self._ended(req)

    def abort(self, req: Request, reason: str) -> None:
        """``req`` ends before finishing (hard stop, horizon)."""
        req.state = RequestState.ABORTED
        req.reason = reason
        req.finish = self.env.now
        self._ended(req)

    def _ended(self, req: Request) -> None:
        self.recorder.record_request(req)
        if self.on_end is not None:
            self.on_end(req)
