"""A scenario's cluster running in real time: the router receives each served request.

:class:`LiveCluster` is :class:`~orcasim.serve.live.LiveSimulation` with the
model :func:`~orcasim.cluster.model.build_cluster_model` builds (replicas,
each an engine with its own context, behind the router) in the real-time
environment. A served request is submitted to the router at the simulated
time the simulation thread receives it; the router admits it and hands it to
a replica in the same instant, so the served schedule is the one the offline
cluster simulation gives for the same arrivals. After each replica's step the
tokens of that replica's running requests are read; a disconnect cancels the
request on the replica holding it (the router keeps no queue: without faults
it never parks a request). The stop aborts every replica's requests.

Replica faults, autoscaling and prefill/decode disaggregation move requests
between engines or change the replicas while the run goes on; they are
refused (:func:`check_servable`).
"""

from __future__ import annotations

from typing import Any

from orcasim.cluster.model import ClusterModel, build_cluster_model, check_cluster_conservation
from orcasim.errors import UsageError
from orcasim.metrics.results import VariantResult
from orcasim.request import Request
from orcasim.scenario import VariantConfig
from orcasim.serve.live import CLIENT_DISCONNECTED, SHUTDOWN, LiveSimulation, _no_requests


def check_servable(cfg: VariantConfig) -> None:
    """Refuse the cluster features ``orcasim serve`` cannot run live (a one-line error)."""
    cluster = cfg.cluster
    if cluster is None:
        return
    for name, on in (("faults", cluster.faults is not None),
                     ("autoscaling", cluster.autoscaling is not None),
                     ("disaggregation (prefill/decode groups)", cluster.disaggregated)):
        if on:
            raise UsageError(f"cluster: orcasim serve cannot serve a cluster with {name} yet; "
                             "remove it, or simulate it with 'orcasim run'")


class LiveCluster(LiveSimulation):
    """A variant's cluster in real time on a thread (see the module docstring)."""

    def _build(self, seed: int) -> None:
        check_servable(self.cfg)
        m: ClusterModel = build_cluster_model(self.cfg, _no_requests(), seed=seed, env=self.env)
        self.model = m  # type: ignore[assignment]
        self.cluster = m
        m.router.source = self.source  # type: ignore[assignment]
        m.router.on_end = self._ended
        self._replica_of: dict[int, int] = {}  # request id -> replica index, while in flight
        self._batches = [getattr(r.policy, "batch", None) for r in m.replicas]
        self._step_ends = [0.0] * len(m.replicas)

    def _submit(self, req: Request) -> None:
        router = self.cluster.router
        before = list(router.routed)
        router.submit(req)
        for i, (a, b) in enumerate(zip(before, router.routed, strict=True)):
            if a != b and req.id in self._tickets:  # routed, and not ended already
                self._replica_of[req.id] = i
                break

    def _cancel_request(self, req: Request) -> None:
        i = self._replica_of.get(req.id)
        if i is not None:
            self.cluster.replicas[i].ctx.cancel(req, CLIENT_DISCONNECTED)

    def _batch_of(self, req: Request) -> Any:
        i = self._replica_of.get(req.id)
        return None if i is None else self._batches[i]

    def _ended(self, req: Request) -> None:
        super()._ended(req)
        self._replica_of.pop(req.id, None)

    def _after_event(self) -> None:
        """After a simulated event: each replica whose step ended reports its tokens."""
        ends = self._step_ends
        stepped = False
        for r in self.cluster.replicas:
            t = r.ctx.last_step_end
            if t != ends[r.index]:
                ends[r.index] = t
                if not stepped:
                    self._lag()
                    stepped = True
                self._collect(r.policy)

    def _stop(self, _event: Any) -> None:
        self.source.closed = True
        for r in self.cluster.replicas:
            assert r.engine is not None
            r.engine.stop(SHUTDOWN)
        for r in self.cluster.replicas:  # idle policies see that no request will come
            r.ctx.arrivals_ended()

    def snapshot(self) -> dict[str, Any]:
        """Gauges summed over replicas (KV usage: the mean of the replicas' shares) and each
        replica's own under ``replicas``: (name, running, waiting, KV usage)."""
        per = []
        preemptions = 0
        for r in self.cluster.replicas:
            ctx = r.ctx
            per.append((r.name, float(ctx.slots.count - ctx.slots.reserved),
                        float(len(ctx.waiting)), float(ctx.kv.usage)))
            preemptions += sum(ctx.preemptions.values())
        n = len(per)
        return {"running": sum(p[1] for p in per), "waiting": sum(p[2] for p in per),
                "kv_usage": sum(p[3] for p in per) / n, "preemptions": float(preemptions),
                "prompt_tokens": float(self.prompt_tokens),
                "generation_tokens": float(self.generation_tokens),
                "lag": self.lags[-1] if self.lags else 0.0, "replicas": per}

    def _result(self) -> VariantResult:
        from orcasim.cluster.results import cluster_result

        check_cluster_conservation(self.cfg, self.cluster, self.num_submitted)
        return cluster_result(self.cfg, self.cluster, False)
