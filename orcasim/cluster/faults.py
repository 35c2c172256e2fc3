"""Replica failures: scheduled or random, noticed by the router after a health-check delay.

When a replica fails, its engine stops at once (the step in flight is lost)
and every request it held leaves it with its KV memory; the replica's prefix
cache is gone too. The router keeps routing to it until it notices, a
``health_check_delay`` later; requests sent meanwhile are lost as well. When
it notices, it stops routing there and retries every lost request on a
healthy replica from its prompt (``num_retries``), at most ``max_retries``
times per request, after which the request is aborted with reason
``replica_failed``. While no replica is healthy, requests wait at the router
if a repair is coming, else they are aborted with ``replica_failed``. A
repaired replica starts again with a fresh engine (empty batch, empty KV
pool and cache) and takes requests at once. Every request still ends exactly
once: cluster-wide conservation is checked after every run.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.cluster.config import FaultOptions
    from orcasim.cluster.model import ClusterModel, Replica
    from orcasim.scenario import VariantConfig
    from orcasim.workload.base import WorkloadArrays

#: spawn key of the fault stream (policies 1, router 2)
FAULT_RNG_STREAM = 3


class FaultInjector:
    """Fails and repairs replicas, and hands their requests back to the router."""

    def __init__(self, model: ClusterModel, cfg: VariantConfig, arrays: WorkloadArrays,
                 opts: FaultOptions, seed: int) -> None:
        self.model = model
        self.cfg = cfg
        self.arrays = arrays
        self.opts = opts
        self.seed = seed
        self.env = model.env
        self.num_failures = 0
        self.downtime = 0.0
        self._down_since: dict[int, float] = {}
        self._repairs_due = 0  # repairs scheduled and not yet done
        router = model.router
        router.dynamic = True
        router.max_retries = opts.max_retries
        router.repair_expected = lambda: self._repairs_due > 0 or opts.random is not None
        by_name = {r.name: r for r in model.replicas}
        env = self.env
        for ev in sorted(opts.events, key=lambda e: e.at):
            env.process(self._scheduled(by_name[ev.replica], ev.at, ev.repair_after))
        if opts.random is not None:
            rng = np.random.default_rng(np.random.SeedSequence(seed,
                                                               spawn_key=(FAULT_RNG_STREAM,)))
            for r in model.replicas:
                env.process(self._random(r, rng, opts.random.mttf, opts.random.mttr))

    def _done(self) -> bool:
        return self.model.router.no_more_arrivals

    def _scheduled(self, r: Replica, at: float, repair_after: float | None
                   ) -> Generator[simpy.Event, Any, None]:
        if repair_after is not None:
            self._repairs_due += 1
        yield self.env.timeout(at)
        if not r.up:  # already down: this event only schedules the repair
            pass
        elif not self._done():
            self.fail(r)
        if repair_after is not None:
            yield self.env.timeout(repair_after)
            self._repairs_due -= 1
            if not r.up:
                self.repair(r)

    def _random(self, r: Replica, rng: np.random.Generator, mttf: float, mttr: float
                ) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            yield env.timeout(float(rng.exponential(mttf)))
            if self._done():
                return
            if r.up:
                self.fail(r)
            yield env.timeout(float(rng.exponential(mttr)))
            if not r.up:
                self.repair(r)

    def fail(self, r: Replica) -> None:
        """Replica ``r`` fails now: its engine stops and its requests are lost with their KV."""
        self.num_failures += 1
        self._down_since[r.index] = self.env.now
        r.up = False
        ctx, policy, engine = r.ctx, r.policy, r.engine
        lost: list[Request] = [*policy.running_requests(), *ctx.waiting]
        for req in lost:  # still counted as outstanding here until the router notices
            was_running = req.state == RequestState.RUNNING
            policy.cancel(req)
            if was_running:
                ctx.slots.release()
            r.recorder.num_arrived -= 1  # it arrived here but will end elsewhere
        assert engine is not None
        engine.stop("replica_failed")  # nothing left to abort: the step in flight is lost
        r.past.append((ctx, policy, engine))
        r.engine = None
        r.limbo.extend(lost)
        self.env.process(self._notice(r))

    def _notice(self, r: Replica) -> Generator[simpy.Event, Any, None]:
        """The router notices ``r``'s failure after the health-check delay and retries."""
        yield self.env.timeout(self.opts.health_check_delay)
        router = self.model.router
        if not r.up:
            r.healthy = False
            router.view.set_available(r.index, False)
        lost, r.limbo = r.limbo, []
        for req in lost:
            router.take_back(r.index, req)
        for req in lost:
            router.retry(req)

    def repair(self, r: Replica) -> None:
        """``r`` is back with a fresh engine (empty memory and cache) and takes requests."""
        self.downtime += self.env.now - self._down_since.pop(r.index)
        self.model.restart(r)

    def summary(self) -> dict[str, float]:
        """``num_replica_failures``, ``num_retries`` and ``replica_downtime_s``."""
        now = self.env.now
        down = self.downtime + sum(now - t for t in self._down_since.values())
        return {"num_replica_failures": self.num_failures,
                "num_retries": self.model.router.num_retries, "replica_downtime_s": down}
