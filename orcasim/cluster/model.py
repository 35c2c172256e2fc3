"""Building and running a cluster: replicas (whole engines) behind one router, one SimPy env.

Every replica is built exactly as :func:`orcasim.simulation.build_model`
builds the single engine (KV memory, policy, clients, latency model, engine)
with its own recorder; the workload's source submits into the router. A
one-replica cluster therefore runs the same events in the same order as the
single engine and gives bit-identical results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import simpy

from orcasim.admission.base import Gate
from orcasim.cluster.config import GroupConfig
from orcasim.cluster.router import AdmissionView, Router
from orcasim.context import SchedulerContext
from orcasim.engine import Engine
from orcasim.errors import ScenarioError, SimulationError
from orcasim.latency.base import LatencyModel
from orcasim.metrics.recorder import Recorder
from orcasim.policies.base import Policy
from orcasim.request import Request
from orcasim.routing.base import RouterView
from orcasim.scenario import VariantConfig
from orcasim.source import make_source
from orcasim.workload.base import WorkloadArrays

#: spawn key of the router's random stream (the policies' is 1, the workload's the seed itself)
ROUTER_RNG_STREAM = 2


@dataclass
class Replica:
    """One engine of the cluster."""

    index: int
    name: str
    group: GroupConfig
    ctx: SchedulerContext
    recorder: Recorder
    policy: Policy
    latency: LatencyModel
    engine: Engine | None = None
    #: the engines (contexts, policies) this replica ran before failures, oldest first
    past: list[tuple[SchedulerContext, Policy, Engine]] = field(default_factory=list)
    up: bool = True  # False while failed
    #: requests routed here while it was down and the router did not know yet
    limbo: list[Request] = field(default_factory=list)
    healthy: bool = True  # what the router believes (it notices a failure after a delay)

    @property
    def busy_time(self) -> float:
        """GPU-busy seconds over every engine this replica ran."""
        now = self.engine.busy_time if self.engine is not None else 0.0
        return now + sum(e.busy_time for _, _, e in self.past)

    def kv_usage(self) -> float:
        """Share of the replica's KV pool allocated now (0 without a memory limit)."""
        kv = self.ctx.kv
        return float(kv.usage) if kv.limited else 0.0

    def prefix_cache(self) -> Any:
        """The replica's prefix-cache manager, or ``None`` without one."""
        mgr = getattr(self.policy, "kv", None)
        return mgr if getattr(mgr, "enable_caching", False) and hasattr(mgr, "hasher") else None


@dataclass
class ClusterModel:
    """A cluster's SimPy model, built and ready to run."""

    env: simpy.Environment
    replicas: list[Replica]
    router: Router
    faults: Any = None  # a FaultInjector with a faults section
    scaler: Any = None  # an Autoscaler with an autoscaling section
    disagg: Any = None  # a Disaggregation with prefill and decode groups
    cfg: Any = None
    arrays: Any = None
    seed: int = 0
    #: the groups of replicas that step together (LockstepGroup)
    lockstep: list[Any] = field(default_factory=list)

    def restart(self, r: Replica) -> None:
        """Give ``r`` a fresh engine (empty batch, KV pool and cache) that takes requests."""
        cluster = self.cfg.cluster
        g_index = cluster.groups.index(r.group)
        ctx, policy, latency = replica_parts(self.cfg, self.arrays, r.group, g_index, self.env,
                                             r.recorder, self.seed, r.index,
                                             len(r.past) + (r.engine is None and not r.past))
        ctx.source = r.ctx.source
        ctx.on_end = r.ctx.on_end
        r.ctx, r.policy, r.latency = ctx, policy, latency
        r.engine = Engine(self.env, ctx, policy, latency)
        r.up = r.healthy = True
        self.router.view.set_available(r.index, True)
        self.router.unpark()


def build_cluster_model(cfg: VariantConfig, arrays: WorkloadArrays, *, trace_steps: bool = False,
                        seed: int | None = None,
                        env: simpy.Environment | None = None) -> ClusterModel:
    """Build ``cfg``'s cluster on ``arrays``: replicas, router, source, engines (in ``env``,
    a new environment by default; ``orcasim serve`` passes a real-time one)."""
    from orcasim.simulation import _section

    cluster = cfg.cluster
    assert cluster is not None
    s = cfg.seed if seed is None else seed
    moves = cluster.faults is not None or cluster.disaggregated
    if moves and (cfg.clients is not None or "patience" in arrays.attrs
                  or "timeout" in arrays.attrs):
        raise ScenarioError("clients", "client patience and timeouts are not supported yet "
                            "with replica faults or disaggregation (requests move between "
                            "replicas)")
    env = simpy.Environment() if env is None else env
    replicas: list[Replica] = []
    for g_index, group in enumerate(cluster.groups):
        for name in group.replica_names():
            i = len(replicas)
            rec_cls = Recorder
            if group.role == "prefill":
                from orcasim.cluster.disagg import HandoffRecorder as rec_cls  # type: ignore[assignment]
            rec = rec_cls(trace_steps=trace_steps, series_capacity=cfg.output.series_capacity)
            ctx, policy, latency = replica_parts(cfg, arrays, group, g_index, env, rec, s, i)
            replicas.append(Replica(i, name, group, ctx, rec, policy, latency))
    names = [r.name for r in replicas]
    view = ClusterRouterView(names, np.random.default_rng(
        np.random.SeedSequence(s, spawn_key=(ROUTER_RNG_STREAM,))), replicas)
    routing = _section("cluster.router", lambda: cluster.router.create(view))
    if routing.needs_prefix_cache:
        for r in replicas:
            if r.prefix_cache() is None:
                raise ScenarioError("cluster.router", f"routing policy {cluster.router.type!r} "
                                    f"reads replicas' prefix caches; group {r.group.name!r} "
                                    f"runs policy {r.group.policy.type!r} without one (use "
                                    "vllm-v1 with enable_prefix_caching)")
    router = Router(env, replicas, routing, view, Recorder(series_capacity=16),
                    staleness=cluster.staleness, log=cluster.routing_log)
    if cluster.admission:
        adm = AdmissionView(env, replicas)
        controllers = []
        for k, spec in enumerate(cluster.admission):
            controllers.append(_section(f"cluster.admission.{k}",
                                        lambda spec=spec: spec.create(adm)))
        router.gate = Gate(controllers)
    if cluster.staleness > 0:  # first, so each scrape precedes the same instant's arrivals
        env.process(router.scrape())
    make_source(env, router, arrays)  # type: ignore[arg-type]
    model = ClusterModel(env, replicas, router, cfg=cfg, arrays=arrays, seed=s)
    if cluster.autoscaling is not None:  # stops the replicas beyond its initial count
        from orcasim.cluster.autoscale import Autoscaler

        model.scaler = Autoscaler(model, cluster.autoscaling)
    for r in replicas:
        if r.up:
            r.engine = Engine(env, r.ctx, r.policy, r.latency)
    for group in cluster.groups:
        if group.lockstep:
            from orcasim.cluster.lockstep import LockstepGroup

            model.lockstep.append(LockstepGroup(
                env, [r.engine for r in replicas if r.group is group]))  # type: ignore[misc]
    if cluster.disaggregated:
        from orcasim.cluster.disagg import Disaggregation

        _check_decode_memory(replicas, arrays)
        assert cluster.link is not None and cluster.bytes_per_token is not None
        model.disagg = Disaggregation(model, cluster.link, cluster.bytes_per_token)
    if cluster.faults is not None:
        from orcasim.cluster.faults import FaultInjector

        model.faults = FaultInjector(model, cfg, arrays, cluster.faults, s)
    return model


def one_per_group(cfg: VariantConfig) -> VariantConfig:
    """``cfg`` with one replica per group and no faults or scaler: what a check builds to
    validate every group's components (the replicas of a group are identical)."""
    from dataclasses import replace

    cluster = cfg.cluster
    assert cluster is not None
    groups = tuple(replace(g, count=1) for g in cluster.groups)
    return replace(cfg, cluster=replace(cluster, groups=groups, faults=None, autoscaling=None))


def _check_decode_memory(replicas: list[Replica], arrays: WorkloadArrays) -> None:
    """Refuse a decode group whose KV pool cannot hold even the workload's smallest request."""
    from orcasim.policies.vllm_v1 import misfit

    if len(arrays) == 0:
        return
    need = arrays.prompt_len + arrays.output_len
    k = int(need.argmin())
    for r in replicas:
        if r.group.role != "decode":
            continue
        found = misfit(int(arrays.prompt_len[k]), int(arrays.output_len[k]), r.policy.params)
        if found is not None:
            names = list(dict.fromkeys(q.group.name for q in replicas))
            raise ScenarioError(f"cluster.groups.{names.index(r.group.name)}",
                                f"decode group {r.group.name!r} cannot hold any request: "
                                f"the smallest one {found[1]}")


def replica_parts(cfg: VariantConfig, arrays: WorkloadArrays, group: GroupConfig, g_index: int,
                  env: simpy.Environment, rec: Recorder, seed: int, index: int,
                  generation: int = 0) -> tuple[SchedulerContext, Policy, LatencyModel]:
    """A fresh context, policy and latency model for replica ``index`` (its ``generation``-th
    engine: a repaired replica starts again with empty memory and its own random stream)."""
    from orcasim.simulation import build_model_parts

    key = (index, generation) if generation else ((index,) if index else ())
    ctx = SchedulerContext(env, rec, seed=seed, rng_key=key)
    policy, latency = build_model_parts(cfg, group.policy, group.latency, group.memory, ctx,
                                        arrays, f"cluster.groups.{g_index}")
    return ctx, policy, latency


class ClusterRouterView(RouterView):
    """The router's view with live prefix-cache look-ups into the replicas."""

    def __init__(self, names: list[str], rng: np.random.Generator,
                 replicas: list[Replica]) -> None:
        super().__init__(names, rng)
        self._replicas = replicas

    def prefix_hit_tokens(self, req: Request) -> list[int]:
        """Walks the prompt's blocks once for all replicas, stopping at the block no
        replica's cache holds: O(longest hit) block descriptions per request."""

        out = [0] * len(self._replicas)
        groups: dict[int, list[tuple[int, Any, int]]] = {}  # block size -> (replica, mgr, parent)
        for r in self._replicas:
            mgr = r.prefix_cache()
            if mgr is not None:
                groups.setdefault(mgr.block_size, []).append((r.index, mgr, 0))
        for bs, alive in groups.items():
            limit = (max(1, req.prompt_len) - 1) // bs  # a hit never covers the last token
            b = 0
            while alive and b < limit:
                still = []
                for k, mgr, parent in alive:
                    h = mgr.hasher.request_lookup(parent, req, b, bs)
                    if h is not None and mgr.pool.get_cached_block(h) is not None:
                        still.append((k, mgr, h))
                alive = still
                b += 1
                for k, _, _ in alive:
                    out[k] = b * bs
        return out


def check_cluster_conservation(cfg: VariantConfig, model: ClusterModel, num_requests: int) -> None:
    """Every replica conserves its requests, slots and blocks, and across the cluster every
    request that arrived ended exactly once (on a replica, or rejected by the router)."""
    from orcasim.simulation import check_conservation

    env, router = model.env, model.router
    for r in model.replicas:
        label = SimpleNamespace(name=f"{cfg.name or 'scenario'} replica {r.name}",
                                policy=r.group.policy)
        engines = [(ctx, eng) for ctx, _, eng in r.past] + [(r.ctx, r.engine)]
        for ctx, eng in engines:  # a failed replica's old engines hold nothing either
            check_conservation(label, ctx, r.recorder, r.recorder.num_arrived,  # type: ignore[arg-type]
                               env.now, eng)
    recs = [router.recorder, *(r.recorder for r in model.replicas)]
    ended = sum(rec.num_recorded for rec in recs)
    arrived_at_replicas = sum(r.recorder.num_arrived for r in model.replicas)
    # every routing decision put a request on a replica, or (faults) lost it there and retried
    routed = sum(router.routed) - router.num_retries - router.num_lost_aborted
    ids = np.concatenate([rec.request_columns()["id"] for rec in recs])
    distinct = int(np.unique(ids).size)
    if (router.num_arrived != num_requests or ended != num_requests or distinct != ended
            or routed != arrived_at_replicas):
        raise SimulationError(
            f"variant {cfg.name!r}: {router.num_arrived} of {num_requests} requests reached "
            f"the router, {routed} were routed and {arrived_at_replicas} reached a replica; "
            f"{ended} ended ({distinct} distinct): the cluster lost or double-counted requests")
