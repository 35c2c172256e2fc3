"""The open-loop request source: a SimPy process that releases requests at their arrival times."""

from __future__ import annotations

import math
from collections.abc import Generator

import simpy

from orcasim.context import SchedulerContext
from orcasim.request import Request
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


class OpenLoopSource:
    """Releases the workload's requests into ``ctx`` at their arrival times.

    Requests are created only when they arrive, so a long workload costs three
    numbers per request until then. Requests with the same arrival time are
    released together.
    """

    def __init__(self, env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays):
        self.env = env
        self.ctx = ctx
        self._arrival: list[float] = arrays.arrival.tolist()
        self._prompt: list[int] = arrays.prompt_len.tolist()
        self._output: list[int] = arrays.output_len.tolist()
        self._attrs = [
            (key, col.tolist() if hasattr(col, "tolist") else list(col))
            for key, col in arrays.attrs.items()
        ]
        self._next = 0
        self._n = len(self._arrival)
        ctx.source = self
        self.process = env.process(self.run())

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
        submit = self.ctx.submit
        while i < n and arrival[i] <= now:
            req = Request(i, arrival[i], self._prompt[i], self._output[i])
            for key, col in self._attrs:
                setattr(req, key, col[i])
            i += 1
            self._next = i
            submit(req)

    def run(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        while self._next < self._n:
            t = self._arrival[self._next]
            if t > env.now:
                yield env.timeout(delay_until(env.now, t))
            self.flush(env.now)
