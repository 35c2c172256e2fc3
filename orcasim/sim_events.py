"""SimPy events the engine schedules itself: a timeout at an exact time, and a settle event.

:class:`Until` fires at a time given as such (a run's end, a sum of step
latencies); :func:`settle` lets every ordinary event of the current instant
be processed first; :func:`happened` says whether an event has occurred.
"""

from __future__ import annotations

import heapq

import simpy
from simpy.events import NORMAL


class Until(simpy.Timeout):
    """A timeout that fires at time ``at`` exactly.

    A run's end is the sum of its steps' latencies, added one by one; a
    delay ``d`` with ``now + d == at`` need not exist in floating point, so
    the event goes into SimPy's queue at ``at`` itself, as ``env.schedule``
    would put a timeout at ``now + delay``.
    """

    def __init__(self, env: simpy.Environment, at: float) -> None:
        if at < env.now:
            raise ValueError(f"time {at} is in the past (now {env.now})")
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = at - env.now
        self._ok = True
        heapq.heappush(env._queue, (at, NORMAL, next(env._eid), self))  # type: ignore[attr-defined]


#: priority of the engine's settle events: after every ordinary event of the same instant,
#: so engines sharing one environment (a cluster) never wait on each other's settle events
SETTLE = 2


def settle(env: simpy.Environment) -> simpy.Event:
    """An event processed after every ordinary event of this instant, and those they cause."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    env.schedule(ev, SETTLE)
    return ev


def happened(ev: simpy.Event | None) -> bool:
    """True once ``ev`` has occurred: processed, or triggered and not a timeout still pending."""
    if ev is None or ev.callbacks is None:
        return True
    return ev.triggered and not isinstance(ev, simpy.Timeout)
