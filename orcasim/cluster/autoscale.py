"""Autoscaling: a scaler process that starts and drains replicas to hold a load metric.

Every ``interval`` seconds the scaler reads its metric: ``queue`` (requests
waiting, summed over serving replicas, per serving replica) or ``ttft`` (the
``percentile`` of the TTFTs of requests that ended in the last ``window``
seconds). Above ``target`` it starts the lowest-numbered stopped replica,
which serves after ``cold_start`` seconds with a fresh engine; below
``target x scale_down_below`` (and with no start pending) it drains the
highest-numbered serving replica: the router stops sending to it at once and
it stops when its last request has ended, so nothing is lost. Replicas
between ``min`` and ``max`` only; replicas beyond ``initial`` start stopped.
GPU-seconds count each replica from its start decision (cold start included)
to its stop, or to the end of the run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.cluster.config import AutoscalingOptions
    from orcasim.cluster.model import ClusterModel, Replica


class Autoscaler:
    """Starts and drains replicas; keeps the timeline of scaling events and GPU time."""

    def __init__(self, model: ClusterModel, opts: AutoscalingOptions) -> None:
        self.model = model
        self.opts = opts
        self.env = model.env
        reps = model.replicas
        self.max = opts.max if opts.max is not None else len(reps)
        first = opts.initial if opts.initial is not None else opts.min
        self.starting = 0
        self._pending: set[int] = set()  # replicas in their cold start
        self.draining: set[int] = set()
        self.gpu_since: dict[int, float] = {}  # replica -> when it was started
        self.gpu_time = 0.0
        #: (time, replica, event): start (decision), serving, drain, stop
        self.timeline: list[tuple[float, str, str]] = []
        self._ends: deque[tuple[float, float]] = deque()  # (end time, ttft) of ended requests
        router = model.router
        router.dynamic = True  # replicas wait for the last request anywhere before ending
        router.repair_expected = lambda: self.starting > 0
        router.on_replica_idle = self._idle
        router.on_request_end = self._ended if opts.metric == "ttft" else None
        for r in reps[first:]:  # stopped (no engine) until the scaler starts them
            r.up = r.healthy = False
            router.view.set_available(r.index, False)
        for r in reps[:first]:
            self.gpu_since[r.index] = 0.0
        self.env.process(self.run())

    # -- the metric -------------------------------------------------------------------------
    def _serving(self) -> list[Replica]:
        return [r for r in self.model.replicas if r.up and r.index not in self.draining]

    def _ended(self, req: Request) -> None:
        if req.state == RequestState.FINISHED and req.first_token is not None:
            self._ends.append((self.env.now, req.first_token - req.arrival))

    def metric(self) -> float:
        """The current value of the scaler's metric (NaN: no data yet)."""
        if self.opts.metric == "queue":
            serving = self._serving()
            return sum(len(r.ctx.waiting) for r in serving) / max(1, len(serving))
        ends, start = self._ends, self.env.now - self.opts.window
        while ends and ends[0][0] < start:
            ends.popleft()
        if not ends:
            return float("nan")
        return float(np.percentile([t for _, t in ends], self.opts.percentile))

    # -- decisions -----------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        env, opts, router = self.env, self.opts, self.model.router
        while True:
            yield env.timeout(opts.interval)
            if router.no_more_arrivals:
                return
            m = self.metric()
            serving = self._serving()
            if m > opts.target and len(serving) + self.starting < self.max:
                stopped = [r for r in self.model.replicas if not r.up and
                           r.index not in self.draining and r.index not in self._pending]
                if stopped:
                    env.process(self._start(stopped[0]))
            elif (m < opts.target * opts.scale_down_below and not self.starting
                  and len(serving) > opts.min):
                self._drain(serving[-1])

    def _start(self, r: Replica) -> Generator[simpy.Event, Any, None]:
        self.starting += 1
        self._pending.add(r.index)
        self.gpu_since[r.index] = self.env.now
        self.timeline.append((self.env.now, r.name, "start"))
        yield self.env.timeout(self.opts.cold_start)
        self.starting -= 1
        self._pending.discard(r.index)
        self.model.restart(r)
        self.timeline.append((self.env.now, r.name, "serving"))

    def _drain(self, r: Replica) -> None:
        self.draining.add(r.index)
        r.healthy = False
        self.model.router.view.set_available(r.index, False)
        self.timeline.append((self.env.now, r.name, "drain"))
        if not self.model.router.live_outstanding[r.index]:
            self._stop(r)

    def _idle(self, i: int) -> None:
        """Replica ``i``'s last outstanding request ended (in its engine's step): stop it
        in this instant, once that step is through."""
        if i in self.draining:
            ev = self.env.timeout(0.0)
            ev.callbacks.append(lambda _: self._stop_if_idle(self.model.replicas[i]))

    def _stop_if_idle(self, r: Replica) -> None:
        if r.index in self.draining and not self.model.router.live_outstanding[r.index]:
            self._stop(r)

    def _stop(self, r: Replica) -> None:
        self.draining.discard(r.index)
        r.up = False
        engine = r.engine
        if engine is not None:
            engine.stop("scaled_down")  # idle: nothing to abort
            r.past.append((r.ctx, r.policy, engine))
            r.engine = None
        self.gpu_time += self.env.now - self.gpu_since.pop(r.index)
        self.timeline.append((self.env.now, r.name, "stop"))

    def summary(self, end: float) -> dict[str, float]:
        """GPU-seconds (replicas' running time to ``end``), scale-ups and scale-downs."""
        running = sum(max(0.0, end - t) for t in self.gpu_since.values())
        events = [e for _, _, e in self.timeline]
        return {"gpu_seconds": self.gpu_time + running, "num_scale_ups": events.count("start"),
                "num_scale_downs": events.count("drain")}
