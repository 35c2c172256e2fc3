"""The router: the cluster's front door, where arrivals are admitted and sent to replicas.

The workload's source submits into the :class:`Router` as it would into one
engine's context. The router runs the cluster-level admission controllers,
asks its routing policy for a replica and submits the request to that
replica's :class:`~orcasim.context.SchedulerContext` in the same instant, so
routing adds no event of its own. Each replica's context sees the workload's
source through a :class:`SourceView` (its policy polls arrivals and learns
when they are done exactly as in a single engine).

With ``staleness > 0`` a scraper process copies the replicas' load into the
routing policy's :class:`~orcasim.routing.base.RouterView` every
``staleness`` seconds; with 0 the view's load lists are the live counters.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from orcasim.request import Request, RequestState
from orcasim.routing.base import RouterView, RoutingPolicy
from orcasim.source import ArrivalSource

if TYPE_CHECKING:
    from orcasim.cluster.model import Replica
    from orcasim.metrics.recorder import Recorder
    from orcasim.source import OpenLoopSource


class SourceView(ArrivalSource):
    """The workload's source as one replica's context sees it (arrivals go via the router)."""

    def __init__(self, router: Router) -> None:
        self._router = router

    @property
    def exhausted(self) -> bool:
        return self._router.no_more_arrivals

    def pending_until(self, now: float) -> bool:
        src = self._router.source
        return src is not None and src.pending_until(now)

    def flush(self, now: float) -> None:
        src = self._router.source
        if src is not None:
            src.flush(now)


class AllWaiting:
    """Every replica's waiting queue as one read-only collection (cluster-level admission)."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = replicas

    def __len__(self) -> int:
        return sum(len(r.ctx.waiting) for r in self._replicas)

    def __iter__(self) -> Iterator[Request]:
        for r in self._replicas:
            yield from r.ctx.waiting


class AdmissionView:
    """What a cluster-level admission controller reads: the clock, all queues, starts."""

    def __init__(self, env: simpy.Environment, replicas: Sequence[Replica]) -> None:
        self.env = env
        self.waiting = AllWaiting(replicas)
        self._replicas = replicas

    @property
    def now(self) -> float:
        return self.env.now

    @property
    def num_started(self) -> int:
        return sum(r.ctx.num_started for r in self._replicas)


class Router:
    """Admits, routes and counts; records requests it rejects itself."""

    def __init__(self, env: simpy.Environment, replicas: Sequence[Replica], policy: RoutingPolicy,
                 view: RouterView, recorder: Recorder, *, staleness: float = 0.0,
                 log: bool = False) -> None:
        self.env = env
        self.replicas = list(replicas)
        self.policy = policy
        self.view = view
        self.recorder = recorder  # requests the router itself rejects
        self.staleness = staleness
        self.source: OpenLoopSource | None = None  # set by the source (as on a context)
        self.on_end: Callable[[Request], None] | None = None  # set by a chained source
        self.gate: Callable[[Request], str | None] | None = None
        n = len(self.replicas)
        self.live_outstanding = [0] * n
        self.live_tokens = [0] * n
        self.routed = [0] * n
        self.num_arrived = 0
        self._prompt: dict[int, int] = {}  # outstanding request id -> its prompt tokens
        self._imbalance_sum = 0.0
        self._imbalance_n = 0
        self.log: list[tuple[float, int, int, str]] | None = [] if log else None
        #: faults, autoscaling or disaggregation: requests may reach a replica after the source
        #: is exhausted (retries, transfers), so replicas wait for every request to end
        self.dynamic = False
        self.max_retries = 0
        self.total_outstanding = 0
        self.num_retries = 0
        self.num_lost_aborted = 0  # lost to a failure with no retry left
        self._tries: dict[int, int] = {}
        self.parked: list[Request] = []  # waiting for a healthy replica (all down)
        self.repair_expected: Callable[[], bool] = lambda: False
        self.on_replica_idle: Callable[[int], None] | None = None  # its last request ended
        self.on_request_end: Callable[[Request], None] | None = None
        #: called with a request just before a replica gets it (disaggregation)
        self.prepare: Callable[[Request], None] | None = None
        self._needs_kv = bool(getattr(policy, "needs_kv_usage", False))
        if staleness == 0:
            view.outstanding = self.live_outstanding
            view.tokens = self.live_tokens
        for i, rep in enumerate(self.replicas):
            rep.ctx.source = SourceView(self)  # type: ignore[assignment]
            rep.ctx.on_end = self._ended_callback(i)

    def _ended_callback(self, i: int) -> Callable[[Request], None]:
        out, tok, prompt = self.live_outstanding, self.live_tokens, self._prompt

        def ended(req: Request) -> None:
            out[i] -= 1
            tok[i] -= prompt.pop(req.id)
            self.total_outstanding -= 1
            if req.state == RequestState.WAITING:  # handed on (prefill -> decode), not ended
                return
            if self.on_end is not None:
                self.on_end(req)
            if self.on_request_end is not None:
                self.on_request_end(req)
            if not out[i] and self.on_replica_idle is not None:
                self.on_replica_idle(i)
            if self.dynamic and not self.total_outstanding:
                self._maybe_end()

        return ended

    @property
    def arrivals_done(self) -> bool:
        """The workload's source has released every request."""
        return self.source is None or self.source.exhausted

    @property
    def no_more_arrivals(self) -> bool:
        """No request will reach a replica any more (what replicas' policies see as the end):
        with faults, not before every request has ended, as a lost one comes back."""
        if not self.dynamic:
            return self.source is None or self.source.exhausted
        return self.arrivals_done and not self.total_outstanding and not self.parked

    def submit(self, req: Request) -> None:
        """A request arrives at the cluster: admit, route, hand it to its replica."""
        self.num_arrived += 1
        gate = self.gate
        if gate is not None:
            reason = gate(req)
            if reason is not None:
                req.state = RequestState.REJECTED
                req.reason = reason
                self.recorder.record_request(req)
                if self.on_end is not None:
                    self.on_end(req)
                self._maybe_end()
                return
        self.route(req)
        self._maybe_end()

    def route(self, req: Request) -> None:
        """Send ``req`` to the replica the policy picks (the next healthy one if that one is
        known to be down); park it while no replica is healthy."""
        view = self.view
        if self._needs_kv and self.staleness == 0:
            view.kv_usage = [r.kv_usage() for r in self.replicas]
        policy = self.policy
        scores = policy.scores(req) if self.log is not None else None
        i = policy.choose(req)
        if self.dynamic and not view.available[i]:
            i = self._healthy_instead(req, scores, i)
            if i < 0:
                self._park(req)
                return
        if self.log is not None:
            text = "" if scores is None else " ".join(f"{s:.6g}" for s in scores)
            self.log.append((self.env.now, req.id, i, text))
        out = self.live_outstanding
        out[i] += 1
        self.total_outstanding += 1
        self.live_tokens[i] += req.prompt_len
        self._prompt[req.id] = req.prompt_len
        self.routed[i] += 1
        total = sum(out)
        self._imbalance_sum += max(out) * len(out) / total
        self._imbalance_n += 1
        rep = self.replicas[i]
        if rep.up:
            if self.prepare is not None:
                self.prepare(req)
            rep.ctx.submit(req)
        else:  # failed, and the router has not noticed yet: lost when it does
            rep.limbo.append(req)

    # -- faults ---------------------------------------------------------------------------
    def _healthy_instead(self, req: Request, scores: list[float] | None, i: int) -> int:
        """The policy picked a replica known to be down: the best-scored healthy one (a
        scoring policy), else the next healthy one by index (-1: none is healthy)."""
        healthy = self.view.available_indices()
        if not healthy:
            return -1
        if scores is None:
            scores = self.policy.scores(req)
        if scores is not None:
            return max(healthy, key=lambda j: (scores[j], -j))
        return next((j for j in healthy if j > i), healthy[0])

    def _park(self, req: Request) -> None:
        if self.repair_expected():
            self.parked.append(req)
        else:
            self._abort(req)

    def unpark(self) -> None:
        """A replica is back: route every parked request again, in arrival order."""
        parked, self.parked = self.parked, []
        for req in parked:
            self.route(req)

    def attach(self, i: int, req: Request) -> None:
        """``req``, already counted as outstanding in the cluster, is now bound for replica
        ``i`` (a decode replica receiving its KV cache)."""
        self.live_outstanding[i] += 1
        self.live_tokens[i] += req.prompt_len
        self._prompt[req.id] = req.prompt_len

    def take_back(self, i: int, req: Request) -> None:
        """``req`` left replica ``i`` without ending (its replica failed)."""
        self.live_outstanding[i] -= 1
        self.live_tokens[i] -= self._prompt.pop(req.id)
        self.total_outstanding -= 1

    def retry(self, req: Request) -> None:
        """Route a request lost to a failure again, from its prompt, or abort it
        (``replica_failed``) once it has used its retries."""
        tries = self._tries.get(req.id, 0) + 1
        if tries > self.max_retries:
            self.num_lost_aborted += 1
            self._abort(req)
            return
        self._tries[req.id] = tries
        self.num_retries += 1
        reset_for_retry(req)
        self.route(req)

    def _abort(self, req: Request) -> None:
        req.state = RequestState.ABORTED
        req.reason = "replica_failed"
        req.finish = self.env.now
        self.recorder.record_request(req)
        if self.on_end is not None:
            self.on_end(req)
        self._maybe_end()

    def _maybe_end(self) -> None:
        """After the last arrival, wake every idle replica so its policy sees the end."""
        if self.no_more_arrivals:
            for rep in self.replicas:
                rep.ctx.arrivals_ended()

    def scrape(self) -> Generator[simpy.Event, Any, None]:
        """Copy replica load into the view every ``staleness`` s, until all is done."""
        view, env = self.view, self.env
        while True:
            view.outstanding = list(self.live_outstanding)
            view.tokens = list(self.live_tokens)
            view.kv_usage = [r.kv_usage() for r in self.replicas]
            if self.arrivals_done and not self.total_outstanding and not self.parked:
                return
            yield env.timeout(self.staleness)

    @property
    def mean_imbalance(self) -> float:
        """Mean over routing decisions of max / mean outstanding requests (1: even)."""
        return self._imbalance_sum / self._imbalance_n if self._imbalance_n else float("nan")


def reset_for_retry(req: Request) -> None:
    """``req`` starts again from its prompt (its KV memory was lost with its replica)."""
    req.state = RequestState.WAITING
    req.reason = None
    req.num_output_tokens = 0
    req.num_computed_tokens = 0
    req.first_scheduled = None
    req.first_token = None
    req.last_token = None
    req.finish = None
    req.slot = -1
    req._batch_seq = -1
    req._done_at = 0
