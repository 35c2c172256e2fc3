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

if TYPE_CHECKING:
    from orcasim.cluster.model import Replica
    from orcasim.metrics.recorder import Recorder
    from orcasim.source import OpenLoopSource


class SourceView:
    """The workload's source as one replica's context sees it (arrivals go via the router)."""

    def __init__(self, router: Router) -> None:
        self._router = router

    @property
    def exhausted(self) -> bool:
        src = self._router.source
        return src is None or src.exhausted

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
            if self.on_end is not None:
                self.on_end(req)

        return ended

    @property
    def arrivals_done(self) -> bool:
        return self.source is None or self.source.exhausted

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
        view = self.view
        if self._needs_kv and self.staleness == 0:
            view.kv_usage = [r.kv_usage() for r in self.replicas]
        policy = self.policy
        if self.log is not None:
            scores = policy.scores(req)
            i = policy.choose(req)
            text = "" if scores is None else " ".join(f"{s:.6g}" for s in scores)
            self.log.append((self.env.now, req.id, i, text))
        else:
            i = policy.choose(req)
        out = self.live_outstanding
        out[i] += 1
        self.live_tokens[i] += req.prompt_len
        self._prompt[req.id] = req.prompt_len
        self.routed[i] += 1
        total = sum(out)
        self._imbalance_sum += max(out) * len(out) / total
        self._imbalance_n += 1
        self.replicas[i].ctx.submit(req)
        self._maybe_end()

    def _maybe_end(self) -> None:
        """After the last arrival, wake every idle replica so its policy sees the end."""
        if self.arrivals_done:
            for rep in self.replicas:
                rep.ctx.arrivals_ended()

    def scrape(self) -> Generator[simpy.Event, Any, None]:
        """Copy replica load into the view every ``staleness`` s, until all is done."""
        view, env = self.view, self.env
        while True:
            view.outstanding = list(self.live_outstanding)
            view.tokens = list(self.live_tokens)
            view.kv_usage = [r.kv_usage() for r in self.replicas]
            if self.arrivals_done and not any(self.live_outstanding):
                return
            yield env.timeout(self.staleness)

    @property
    def mean_imbalance(self) -> float:
        """Mean over routing decisions of max / mean outstanding requests (1: even)."""
        return self._imbalance_sum / self._imbalance_n if self._imbalance_n else float("nan")
