"""Scenario files: YAML -> validated, runnable configuration.

A scenario names a workload, an engine (latency model), a policy, metric
options and optionally several *variants*: each variant is a set of
overrides of the base scenario, and all variants run on the same requests
(the same seed), so their differences come from the overrides alone.

Everything is validated on load. A mistake is a :class:`ScenarioError` with
the file and the dotted field (``workload.arrival.rate: Input should be
greater than 0 (got -1)``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orcasim import registry
from orcasim.clients import ClientOptions
from orcasim.cluster.config import ClusterOptions
from orcasim.control import ControlEvent
from orcasim.errors import ScenarioError, UsageError
from orcasim.experiments.options import SweepOptions
from orcasim.frontend import FrontendOptions
from orcasim.kv.config import MemoryOptions
from orcasim.overrides import (
    check_override_path,
    expand_dotted,
    merge,
    parse_assignment,
    set_path,
)
from orcasim.params import ComponentParams
from orcasim.plugins import load_plugins
from orcasim.spec import Spec, build_spec, validate_params
from orcasim.yaml_input import (
    decode_text,
    parse_yaml,
    read_limited,
)

_NAME = re.compile(r"[A-Za-z0-9._+-]{1,100}")


class SLO(ComponentParams):
    """Per-request latency bounds, seconds; a finished request within all given bounds is good."""

    ttft: float | None = Field(None, gt=0)
    tpot: float | None = Field(None, gt=0)
    e2e: float | None = Field(None, gt=0)


class MetricsOptions(ComponentParams):
    slo: SLO | None = None
    warmup: float = Field(
        0.0, ge=0, lt=1,
        description="leave requests arriving in this first fraction of the arrival span out of "
        "the latency metrics (steady state)",
    )
    cooldown: float = Field(
        0.0, ge=0, lt=1,
        description="leave requests arriving in this last fraction of the arrival span out of "
        "the latency metrics",
    )

    @model_validator(mode="after")
    def _window(self) -> MetricsOptions:
        if self.warmup + self.cooldown >= 1:
            raise ValueError("warmup + cooldown must be < 1 (fractions of the arrival span)")
        return self


class OutputOptions(ComponentParams):
    plots: bool = Field(True, description="write PNG plots with `orcasim run --out`")
    gantt_requests: int = Field(60, gt=0, description="requests drawn in the lifetime Gantt chart")
    series_capacity: int = Field(4096, ge=16, description="rows kept in the per-step series")


class EngineOptions(ComponentParams):
    latency: Any = Field(default_factory=lambda: {"type": "linear"})
    # API-server time outside the engine: options, on/true (defaults) or off/false; unset:
    # on for workloads measured at the client (inference_perf), off otherwise
    frontend: FrontendOptions | None = None

    @field_validator("frontend", mode="before")
    @classmethod
    def _switch(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = {"on": True, "true": True, "off": False, "false": False}.get(v.lower(), v)
        if isinstance(v, bool):
            return {"enabled": v}
        if v is None or isinstance(v, (dict, FrontendOptions)):
            return v
        raise ValueError("options (a mapping), on/true or off/false")


class ScenarioModel(ComponentParams):
    """The top level of a scenario file."""

    name: str = "scenario"
    description: str = ""
    plugins: list[str] = Field(
        default_factory=list,
        description="Python files (relative to the scenario file) or module names to import "
        "first, so the components they register can be used",
    )
    seed: int = Field(0, ge=0)
    workload: Any
    engine: EngineOptions = Field(default_factory=EngineOptions)
    policy: Any
    memory: MemoryOptions | None = None  # KV memory limit; none: unlimited
    clients: ClientOptions | None = None  # client patience and timeouts for every request
    metrics: MetricsOptions = Field(default_factory=MetricsOptions)
    output: OutputOptions = Field(default_factory=OutputOptions)
    admission: list[Any] = Field(default_factory=list)
    events: list[ControlEvent] = Field(default_factory=list)
    cluster: ClusterOptions | None = None  # replicas behind a router
    variants: dict[str, dict[str, Any] | None] | None = None
    sweep: SweepOptions | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        """The name becomes the folder ``orcasim-out/<name>``: it must stay one plain folder."""
        if not _NAME.fullmatch(name) or ".." in name:
            raise PydanticCustomError(
                "scenario_name",
                "must be 1-100 characters from A-Z a-z 0-9 . _ + - without '..' "
                "(it names the output folder orcasim-out/<name>)",
            )
        return name


@dataclass(frozen=True)
class VariantConfig:
    """One runnable configuration: the scenario with one variant's overrides applied."""

    name: str
    seed: int
    workload: Spec
    latency: Spec
    policy: Spec
    metrics: MetricsOptions
    output: OutputOptions
    raw: dict[str, Any] = field(repr=False)
    admission: tuple[Spec, ...] = ()
    events: tuple[ControlEvent, ...] = ()
    memory: MemoryOptions | None = None
    clients: ClientOptions | None = None
    frontend: FrontendOptions | None = None
    cluster: Any = None  # a ClusterConfig: replicas behind a router

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration, every default filled in."""
        out = {
            "seed": self.seed,
            "workload": self.workload.to_dict(),
            "engine": {"latency": self.latency.to_dict()},
            "policy": self.policy.to_dict(),
            "admission": [a.to_dict() for a in self.admission],
            "events": [e.model_dump() for e in self.events],
            "metrics": self.metrics.model_dump(),
        }
        if self.memory is not None:
            out["memory"] = self.memory.model_dump()
        if self.clients is not None:
            out["clients"] = self.clients.model_dump()
        if self.frontend is not None:
            out["engine"]["frontend"] = self.frontend.model_dump()
        elif getattr(self.workload.cls, "client_side", False):
            out["engine"]["frontend"] = False
        if self.cluster is not None:
            out["cluster"] = self.cluster.to_dict()
        return out


class Scenario:
    """A loaded, validated scenario. Immutable: :meth:`override` returns a new one."""

    def __init__(
        self,
        raw: dict[str, Any],
        source: str = "<scenario>",
        overrides: list[tuple[str, Any]] | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.source = source
        self.base_dir = base_dir  # where relative plugin paths start; none: the current directory
        self.overrides: list[tuple[str, Any]] = list(overrides or [])
        self._raw0 = copy.deepcopy(raw)
        self.raw = copy.deepcopy(raw)  # with the overrides applied
        try:
            for path, value in self.overrides:
                check_override_path(self.raw, path)
                set_path(self.raw, path, copy.deepcopy(value))  # never share an override
            self.model: ScenarioModel = validate_params(ScenarioModel, self.raw, "")  # type: ignore[assignment]
            _load_plugins(self.model.plugins, base_dir)
            self.variants: list[VariantConfig] = self._resolve()
        except ScenarioError as err:
            raise ScenarioError(err.field, err.message, source) from None

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def seed(self) -> int:
        return self.model.seed

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]

    def variant(self, name: str) -> VariantConfig:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} (have: {', '.join(self.variant_names)})")

    def override(self, overrides: dict[str, Any] | list[str] | None = None, **kw: Any) -> Scenario:
        """A copy with dotted-path overrides applied.

        ``overrides`` is ``{"policy.max_batch": 16}`` or ``["policy.max_batch=16"]``
        (values parsed as YAML); keyword arguments are top-level fields
        (``seed=3``). A path outside ``variants.`` applies to every variant,
        after the variant's own overrides; ``variants.NAME.field`` targets one.
        """
        items: list[tuple[str, Any]] = []
        if isinstance(overrides, dict):
            items += list(overrides.items())
        elif overrides:
            try:
                items += [parse_assignment(s) for s in overrides]
            except ScenarioError as err:
                raise ScenarioError(err.field, err.message, self.source) from None
        items += list(kw.items())
        return Scenario(self._raw0, self.source, self.overrides + items, self.base_dir)

    def _resolve(self) -> list[VariantConfig]:
        base = {k: v for k, v in self.raw.items() if k != "variants"}
        common = [(p, v) for p, v in self.overrides if not p.startswith("variants.")]
        variants = self.model.variants
        if not variants:
            return [_variant(_policy_type(base.get("policy")), base, "")]
        out = []
        for name, over in variants.items():
            merged = merge(base, _variant_overrides(name, over))
            for path, value in common:
                set_path(merged, path, value)
            out.append(_variant(name, merged, f"variants.{name}: "))
        return out

    def __repr__(self) -> str:
        return f"Scenario({self.name!r}, variants={self.variant_names}, seed={self.seed})"


def _load_plugins(specs: list[str], base_dir: Path | None) -> None:
    """Import the scenario's plugins before its components are looked up in the registries."""
    for i, spec in enumerate(specs):
        try:
            load_plugins([spec], base_dir)
        except UsageError as err:
            raise ScenarioError(f"plugins.{i}", str(err)) from None


def _variant_overrides(name: str, over: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return expand_dotted(over or {})
    except ScenarioError as err:
        raise ScenarioError(f"variants.{name}: {err.field}", err.message) from None


def _policy_type(policy: Any) -> str:
    if isinstance(policy, str):
        return policy
    if isinstance(policy, dict) and isinstance(policy.get("type"), str):
        return policy["type"]
    return "default"


def _variant(name: str, raw: dict[str, Any], where: str) -> VariantConfig:
    try:
        model: ScenarioModel = validate_params(ScenarioModel, raw, "")  # type: ignore[assignment]
        cfg = VariantConfig(
            name=name,
            seed=model.seed,
            workload=build_spec(registry.workloads, model.workload, "workload"),
            latency=build_spec(registry.latency_models, model.engine.latency, "engine.latency"),
            policy=build_spec(registry.policies, model.policy, "policy"),
            metrics=model.metrics,
            output=model.output,
            raw=raw,
            admission=tuple(build_spec(registry.admission, a, f"admission.{i}")
                            for i, a in enumerate(model.admission)),
            events=tuple(model.events),
            memory=model.memory,
            clients=model.clients,
            frontend=None,
            cluster=_cluster(model),
        )
        return replace(cfg, frontend=front_end(model.engine.frontend, cfg.workload))
    except ScenarioError as err:
        raise ScenarioError(f"{where}{err.field}" if where else err.field, err.message) from None


def front_end(given: FrontendOptions | None, workload: Spec) -> FrontendOptions | None:
    """``engine.frontend`` resolved: options, or None (off). Unset, it is on (defaults) for a
    workload measured at the client (``client_side``, e.g. ``inference_perf``)."""
    if given is None:
        return FrontendOptions() if getattr(workload.cls, "client_side", False) else None
    return given if given.enabled else None


def _cluster(model: ScenarioModel) -> Any:
    """The resolved ``cluster`` section (``None`` without one)."""
    if model.cluster is None:
        return None
    from orcasim.cluster.config import build_cluster

    return build_cluster(model.cluster, model.policy, model.engine.latency, model.memory,
                         model.admission, model.events)


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with orcasim."""
    root = resources.files("orcasim.scenarios")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


DEFAULT_SCENARIO = "seed_orca"


def load_scenario(
    path: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None
) -> Scenario:
    """Load a scenario file, or a built-in one by name (default: the seed study).

    ``overrides`` are applied before validation (see :meth:`Scenario.override`).
    """
    if path is None:
        path = DEFAULT_SCENARIO
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") and not p.exists():
        res = resources.files("orcasim.scenarios") / f"{p.name}.yaml"
        if not res.is_file():
            raise ScenarioError(
                "", f"no such scenario file or built-in scenario (built-in: "
                f"{', '.join(builtin_scenarios())})", str(path)
            )
        source = f"{p.name}.yaml"
        text = decode_text(res.read_bytes(), source)
        base_dir: Path | None = None
    else:
        source = str(path)
        text = decode_text(read_limited(p, source), source)
        base_dir = p.resolve().parent
    raw = parse_yaml(text, source)
    sc = Scenario(raw, source, base_dir=base_dir)
    return sc.override(overrides) if overrides else sc

