"""The ``cluster:`` scenario section: groups of replicas behind one router.

::

    cluster:
      router: {type: prefix_affinity, prefix_blocks: 2}
      staleness: 0.05          # seconds between scrapes of replica load (0: live)
      admission: [{type: max_queue, limit: 512}]   # cluster-level rejection
      routing_log: true
      groups:
        - {name: a, count: 4}                          # the scenario's policy, engine, memory
        - {name: b, count: 2, policy: {type: vllm-v1}, engine: {latency: {type: linear}}}

A group without ``policy``, ``engine`` or ``memory`` takes the scenario's
top-level one. Every replica is a whole engine (its own slots and KV pool).
Replica failures (``faults``) are scheduled or random; see
:mod:`orcasim.cluster.faults`. Only ``role: mixed`` replicas exist yet:
disaggregated prefill/decode is refused with a clear error until it is
built. ``autoscaling`` starts and drains replicas (:mod:`orcasim.cluster.autoscale`).
A group with ``lockstep: true`` is the data-parallel engines of one
mixture-of-experts model, stepping together (:mod:`orcasim.cluster.lockstep`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from orcasim import admission as _admission  # noqa: F401  (register the controllers)
from orcasim import registry
from orcasim import routing as _routing  # noqa: F401  (register the routing policies)
from orcasim.errors import ScenarioError
from orcasim.kv.config import MemoryOptions
from orcasim.params import ComponentParams
from orcasim.spec import Spec, build_spec, validate_params

#: replicas a cluster may have at most (every one is a whole engine)
MAX_REPLICAS = 4096
_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
#: cluster-level admission controllers that read only what a router knows
CLUSTER_ADMISSION = ("max_queue", "token_bucket", "slo_ttft")
NOT_YET: dict[str, str] = {}


class GroupEngine(ComponentParams):
    latency: Any = Field(default_factory=lambda: {"type": "linear"})


class GroupOptions(ComponentParams):
    """One group of identical replicas."""

    name: str | None = None
    count: int = Field(1, ge=1, le=MAX_REPLICAS)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    policy: Any = None
    engine: GroupEngine | None = None
    memory: MemoryOptions | None = None
    lockstep: bool = Field(False, description="the replicas are the data-parallel engines of "
                           "one mixture-of-experts model: they start every step together, "
                           "each step lasts as long as the slowest one's, and an engine with "
                           "nothing to run takes dummy steps while the others run "
                           "(orcasim.cluster.lockstep)")

    @field_validator("name")
    @classmethod
    def _plain(cls, name: str | None) -> str | None:
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError("must be 1-40 characters from A-Z a-z 0-9 _ -")
        return name


class FaultEvent(ComponentParams):
    """One replica fails at ``at`` and (optionally) is repaired ``repair_after`` s later."""

    replica: str
    at: float = Field(ge=0, le=1e9)
    repair_after: float | None = Field(None, gt=0, le=1e9, description="none: stays down")


class RandomFaults(ComponentParams):
    """Every replica fails after an exponential time (mean ``mttf``) and is repaired after
    another (mean ``mttr``), over and over, from the run's fault stream."""

    mttf: float = Field(gt=0, le=1e9, description="mean time to failure per replica, s")
    mttr: float = Field(gt=0, le=1e9, description="mean time to repair, s")


class FaultOptions(ComponentParams):
    """Replica failures: scheduled ``events`` and/or ``random`` ones."""

    events: list[FaultEvent] = Field(default_factory=list)
    random: RandomFaults | None = None
    health_check_delay: float = Field(1.0, ge=0, le=1e6, description="seconds until the "
                                      "router notices a failure")
    max_retries: int = Field(1, ge=0, le=100, description="times a request lost to a failure "
                             "is retried on another replica (0: aborted as replica_failed)")


class AutoscalingOptions(ComponentParams):
    """A scaler that starts and drains replicas to hold a load metric near ``target``."""

    min: int = Field(1, ge=1, description="replicas serving at least")
    max: int | None = Field(None, ge=1, description="replicas at most (default: every "
                            "replica of the groups)")
    initial: int | None = Field(None, ge=1, description="replicas serving at the start "
                                "(default: min)")
    metric: Literal["queue", "ttft"] = Field("queue", description="queue: waiting requests "
                                             "per serving replica; ttft: the TTFT percentile "
                                             "of the requests that ended in the last window")
    target: float = Field(gt=0, description="scale up above it")
    scale_down_below: float = Field(0.5, ge=0, lt=1, description="scale down below "
                                    "target x this")
    percentile: float = Field(90.0, gt=0, le=100)
    window: float = Field(30.0, gt=0, description="seconds of history for metric ttft")
    interval: float = Field(10.0, gt=0, description="seconds between scaling decisions")
    cold_start: float = Field(30.0, ge=0, description="seconds from a scale-up decision "
                              "until the replica serves")


class LinkOptions(ComponentParams):
    """The prefill -> decode KV transfer link (disaggregation)."""

    preset: Literal["nvlink", "infiniband_400g", "roce_100g", "pcie_gen5"] | None = Field(
        None, description="bandwidth and latency of a known link (fields below override)")
    bandwidth_gb_s: float | None = Field(None, gt=0, le=1e6, description="GB/s (1e9 bytes)")
    latency_s: float | None = Field(None, ge=0, le=1e3, description="per transfer, s")
    concurrency: int = Field(1, ge=1, le=1 << 20, description="transfers at once")
    bytes_per_token: int | None = Field(None, gt=0, le=10**9, description="KV bytes per "
                                        "token (default: from the decode group's model)")


class ClusterOptions(ComponentParams):
    groups: list[GroupOptions] = Field(min_length=1)
    router: Any = "round_robin"
    staleness: float = Field(0.0, ge=0, le=1e6, description="seconds between scrapes of "
                             "replica load by the router (0: it reads live state)")
    admission: list[Any] = Field(default_factory=list)
    routing_log: bool = False
    faults: FaultOptions | None = None
    autoscaling: AutoscalingOptions | None = None
    link: LinkOptions | None = None


@dataclass(frozen=True)
class GroupConfig:
    """A resolved group: its replicas' policy, latency model and memory."""

    name: str
    count: int
    role: str
    policy: Spec
    latency: Spec
    memory: MemoryOptions | None
    lockstep: bool = False  # the replicas step together (orcasim.cluster.lockstep)

    def replica_names(self) -> list[str]:
        """``name`` for a one-replica group, else ``name-0``, ``name-1``..."""
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{k}" for k in range(self.count)]

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "count": self.count, "role": self.role,
               "policy": self.policy.to_dict(), "engine": {"latency": self.latency.to_dict()}}
        if self.memory is not None:
            out["memory"] = self.memory.model_dump()
        if self.lockstep:
            out["lockstep"] = True
        return out


@dataclass(frozen=True)
class ClusterConfig:
    """A resolved ``cluster`` section."""

    groups: tuple[GroupConfig, ...]
    router: Spec
    staleness: float
    admission: tuple[Spec, ...]
    routing_log: bool
    faults: FaultOptions | None = None
    autoscaling: AutoscalingOptions | None = None
    link: LinkOptions | None = None
    bytes_per_token: int | None = None  # KV bytes per token moved over the link

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "mixed" for g in self.groups)

    @property
    def num_replicas(self) -> int:
        return sum(g.count for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups], "router": self.router.to_dict(),
                "staleness": self.staleness, "admission": [a.to_dict() for a in self.admission],
                "routing_log": self.routing_log,
                "faults": self.faults.model_dump() if self.faults is not None else None,
                "autoscaling": self.autoscaling.model_dump()
                if self.autoscaling is not None else None,
                "link": self.link.model_dump() if self.link is not None else None}


def build_cluster(data: Any, policy: Any, latency: Any, memory: MemoryOptions | None,
                  top_admission: list[Any], events: list[Any]) -> ClusterConfig:
    """Validate a ``cluster`` section; groups inherit the scenario's policy, latency, memory."""
    opts: ClusterOptions = data if isinstance(data, ClusterOptions) else \
        validate_params(ClusterOptions, data, "cluster")  # type: ignore[assignment]
    for key, why in NOT_YET.items():
        if getattr(opts, key) is not None:
            raise ScenarioError(f"cluster.{key}", why)
    if top_admission:
        raise ScenarioError("admission", "with a cluster section, admission control is "
                            "cluster-level: move it to cluster.admission")
    if events:
        raise ScenarioError("events", "scenario events (drain, hard_stop) are not supported "
                            "with a cluster section yet")
    groups = []
    seen: set[str] = set()
    for k, g in enumerate(opts.groups):
        path = f"cluster.groups.{k}"
        name = g.name or f"g{k}"
        if name in seen:
            raise ScenarioError(f"{path}.name", f"group name {name!r} is used twice")
        seen.add(name)
        pol = build_spec(registry.policies, g.policy if g.policy is not None else policy,
                         f"{path}.policy" if g.policy is not None else "policy")
        lat_raw = g.engine.latency if g.engine is not None else latency
        lat = build_spec(registry.latency_models, lat_raw,
                         f"{path}.engine.latency" if g.engine is not None else "engine.latency")
        mem = g.memory if "memory" in g.model_fields_set else memory
        if g.lockstep:
            _check_lockstep(opts, g, path)
        groups.append(GroupConfig(name, g.count, g.role, pol, lat, mem, g.lockstep))
    total = sum(g.count for g in groups)
    if total > MAX_REPLICAS:
        raise ScenarioError("cluster.groups", f"{total} replicas; at most {MAX_REPLICAS}")
    names = [n for g in groups for n in g.replica_names()]
    if len(set(names)) != len(names):
        raise ScenarioError("cluster.groups", "replica names collide (a group named like "
                            "another group's numbered replica); rename a group")
    if opts.faults is not None:
        for k, ev in enumerate(opts.faults.events):
            if ev.replica not in names:
                raise ScenarioError(f"cluster.faults.events.{k}.replica", f"no replica "
                                    f"{ev.replica!r} (replicas: {', '.join(names[:8])}"
                                    f"{', ...' if len(names) > 8 else ''})")
    bpt = _check_roles(opts, groups)
    scale = opts.autoscaling
    if scale is not None:
        top = scale.max if scale.max is not None else total
        first = scale.initial if scale.initial is not None else scale.min
        if top > total:
            raise ScenarioError("cluster.autoscaling.max", f"{top} replicas, but the groups "
                                f"have {total}")
        if not scale.min <= first <= top:
            raise ScenarioError("cluster.autoscaling", f"needs min <= initial <= max (got "
                                f"{scale.min}, {first}, {top})")
    router = build_spec(registry.routers, opts.router, "cluster.router")
    admission = []
    for i, a in enumerate(opts.admission):
        spec = build_spec(registry.admission, a, f"cluster.admission.{i}")
        if spec.type not in CLUSTER_ADMISSION:
            raise ScenarioError(f"cluster.admission.{i}.type", f"{spec.type!r} reads one "
                                "engine's queue or memory; at cluster level use one of: "
                                f"{', '.join(CLUSTER_ADMISSION)}")
        admission.append(spec)
    return ClusterConfig(tuple(groups), router, opts.staleness, tuple(admission),
                         opts.routing_log, opts.faults, opts.autoscaling, opts.link, bpt)


def _check_lockstep(opts: ClusterOptions, g: GroupOptions, path: str) -> None:
    """A lockstep group: two replicas or more, serving mixed, with no failures or scaler."""
    if g.count < 2:
        raise ScenarioError(f"{path}.lockstep", "a lockstep group needs count >= 2 (its "
                            "replicas are the data-parallel engines that step together)")
    if g.role != "mixed":
        raise ScenarioError(f"{path}.lockstep", f"not supported for {g.role} replicas yet")
    for key in ("faults", "autoscaling"):
        if getattr(opts, key) is not None:
            raise ScenarioError(f"cluster.{key}", "not supported with a lockstep group yet "
                                "(its engines start and stop together)")


def _check_roles(opts: ClusterOptions, groups: list[GroupConfig]) -> int | None:
    """Disaggregation's rules: prefill and decode groups both (no mixed ones), vllm-v1 on
    each, a link, and the KV bytes per token it moves; return those bytes."""
    roles = {g.role for g in groups}
    if roles == {"mixed"}:
        if opts.link is not None:
            raise ScenarioError("cluster.link", "a link needs prefill and decode groups")
        return None
    for role in ("prefill", "decode"):
        if role not in roles:
            raise ScenarioError("cluster.groups", f"disaggregation needs a {role} group "
                                f"(groups have roles: {', '.join(sorted(roles))})")
    if "mixed" in roles:
        raise ScenarioError("cluster.groups", "mixed groups cannot serve beside prefill and "
                            "decode groups yet")
    for k, g in enumerate(groups):
        if g.policy.type != "vllm-v1":
            raise ScenarioError(f"cluster.groups.{k}.policy", f"{g.role} replicas run "
                                f"vllm-v1 (its prefix cache receives the KV), not "
                                f"{g.policy.type!r}")
    for key in ("faults", "autoscaling"):
        if getattr(opts, key) is not None:
            raise ScenarioError(f"cluster.{key}", "not supported with disaggregated "
                                "prefill/decode yet")
    link = opts.link
    if link is None:
        raise ScenarioError("cluster.link", "disaggregated prefill/decode needs a link "
                            "(e.g. {preset: nvlink})")
    if link.preset is None and link.bandwidth_gb_s is None:
        raise ScenarioError("cluster.link.bandwidth_gb_s", "required without a preset")
    if link.bytes_per_token is not None:
        return link.bytes_per_token
    decode = next(g for g in groups if g.role == "decode")
    bpt = _model_bytes(decode)
    if bpt is None:
        raise ScenarioError("cluster.link.bytes_per_token", "required: the decode group "
                            "names no model (in its memory or latency section) to size "
                            "the KV from")
    return bpt


def _model_bytes(g: GroupConfig) -> int | None:
    """KV bytes per token of the group's model (memory section first, then latency model)."""
    from orcasim.hardware import get_model

    if g.memory is not None and g.memory.model is not None:
        return get_model(g.memory.model).kv_bytes_per_token(g.memory.tp)
    params = g.latency.params
    name = getattr(params, "model", None)
    if isinstance(name, str):
        try:
            return get_model(name).kv_bytes_per_token(getattr(params, "tp", 1) or 1)
        except (KeyError, ValueError):
            return None
    return None
