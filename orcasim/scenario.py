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
import difflib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from orcasim import registry
from orcasim.clients import ClientOptions
from orcasim.control import ControlEvent
from orcasim.errors import ScenarioError, UsageError
from orcasim.experiments.options import SweepOptions
from orcasim.kv.config import MemoryOptions
from orcasim.params import ComponentParams
from orcasim.plugins import load_plugins
from orcasim.spec import Spec, build_spec, short_repr, validate_params

try:
    from yaml._yaml import CParser as _CParser
except ImportError:  # PyYAML built without libyaml
    _CParser = None

#: a scenario file larger than this is refused unread
MAX_TEXT_BYTES = 20 * 2**20
#: a YAML document expanding (through aliases) to more nodes than this is refused
MAX_NODES = 1_000_000
#: a YAML document nested deeper than this (after alias expansion) is refused
MAX_DEPTH = 100
#: an override path with more dotted parts than this is refused
MAX_PATH_PARTS = 50
_MERGE_TAG = "tag:yaml.org,2002:merge"
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
                _check_override_path(self.raw, path)
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


def _check_override_path(raw: dict[str, Any], path: str) -> None:
    """Refuse an override that would silently create a variant through a misspelt name.

    ``variants.NAME.field`` must name an existing variant; ``variants.NAME``
    (a whole variant) or ``variants`` (all of them) may add new ones.
    """
    parts = str(path).split(".")
    if len(parts) > MAX_PATH_PARTS:
        raise ScenarioError(short_repr(path), f"more than {MAX_PATH_PARTS} dotted parts")
    if len(parts) < 3 or parts[0] != "variants":
        return
    variants = raw.get("variants")
    names = [str(n) for n in variants] if isinstance(variants, dict) else []
    if parts[1] in names:
        return
    have = ", ".join(names) if names else "none"
    hint = difflib.get_close_matches(parts[1], names, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ScenarioError(f"variants.{parts[1]}", f"no such variant (have: {have}){suggestion}")


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
        return VariantConfig(
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
        )
    except ScenarioError as err:
        raise ScenarioError(f"{where}{err.field}" if where else err.field, err.message) from None


def merge(base: Any, over: Any) -> Any:
    """Deep-merge ``over`` into a copy of ``base``.

    Mappings merge key by key, except that a mapping whose ``type`` changes is
    replaced whole (another component's parameters do not carry over).
    """
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    if "type" in over and base.get("type") != over["type"]:
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if k in out else copy.deepcopy(v)
    return out


def expand_dotted(d: dict[str, Any]) -> dict[str, Any]:
    """``{"policy.max_batch": 8}`` -> ``{"policy": {"max_batch": 8}}`` (recursively).

    A result nested deeper than :data:`MAX_DEPTH` is refused: dotted keys
    inside nested mappings multiply depth, and a later deep copy would not
    survive it.
    """
    return _expand(d, 0)


def _expand(d: dict[str, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        parts = str(k).split(".")
        if depth + len(parts) > MAX_DEPTH:
            raise ScenarioError(short_repr(str(k)), f"nested deeper than {MAX_DEPTH} levels")
        v = _expand(v, depth + len(parts)) if isinstance(v, dict) else v
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        leaf = parts[-1]
        node[leaf] = merge(node[leaf], v) if leaf in node else v
    return out


def set_path(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set ``raw[a][b][c] = value`` for ``path = "a.b.c"``, creating mappings as needed."""
    parts = path.split(".")
    node = raw
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if isinstance(nxt, str) and i == len(parts) - 2 and p in ("policy", "latency"):
            nxt = {"type": nxt}
        if nxt is None:
            nxt = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(
                ".".join(parts[: i + 1]), "is not a mapping; cannot set a field in it"
            )
        node[p] = nxt
        node = nxt
    node[parts[-1]] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"policy.max_batch=16"`` -> ``("policy.max_batch", 16)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ScenarioError(text, "an override must look like field.path=value")
    path, _, value = text.partition("=")
    path = path.strip()
    try:
        parsed = load_yaml(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    except ScenarioError as err:
        raise ScenarioError(path, f"value: {err.message}") from None
    return path, parsed


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
        text = decode_text(_read_bytes(p, source), source)
        base_dir = p.resolve().parent
    raw = parse_yaml(text, source)
    sc = Scenario(raw, source, base_dir=base_dir)
    return sc.override(overrides) if overrides else sc


def _read_bytes(path: Path, source: str) -> bytes:
    """The first :data:`MAX_TEXT_BYTES` + 1 bytes of ``path``: a huge file is never read whole."""
    try:
        with path.open("rb") as f:
            return f.read(MAX_TEXT_BYTES + 1)
    except OSError as err:
        raise ScenarioError("", f"cannot read: {err.strerror}", source) from None


def decode_text(data: bytes, source: str) -> str:
    """Scenario bytes as text: UTF-8, with or without a byte-order mark, and size-limited.

    UTF-16 and other encodings are refused by name rather than surfacing as a
    decoding traceback (UTF-16 text of ASCII characters is valid UTF-8 full of
    NUL characters, hence the NUL check).
    """
    if len(data) > MAX_TEXT_BYTES:
        raise ScenarioError("", f"cannot read: larger than {MAX_TEXT_BYTES // 2**20} MB", source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = "\x00"
    if "\x00" in text:
        raise ScenarioError("", "cannot read: not UTF-8 text", source)
    return text


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse scenario YAML; syntax errors name the line.

    Beyond syntax, a document is refused if it repeats a key in a mapping,
    nests deeper than :data:`MAX_DEPTH` or expands (through aliases) to more
    than :data:`MAX_NODES` nodes: each of these is a one-line error, never a
    silent choice, a recursion error or an exponential blow-up.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise ScenarioError("", f"cannot read: larger than {MAX_TEXT_BYTES // 2**20} MB", source)
    try:
        raw = load_yaml(text)
    except ScenarioError as err:
        raise ScenarioError(err.field, err.message, source) from None
    except yaml.YAMLError as err:
        raise ScenarioError(*_yaml_problem(err), source) from None
    if not isinstance(raw, dict):
        raise ScenarioError("", "a scenario must be a YAML mapping", source)
    return raw


def _yaml_problem(err: yaml.YAMLError) -> tuple[str, str]:
    """``(where, message)`` of a YAML syntax error, without quoting the document."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return where, f"invalid YAML: {problem}"


if _CParser is not None:

    class _Loader(Composer, _CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's parser with PyYAML's composer, so composition can be checked as it goes."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)

else:
    _Loader = yaml.SafeLoader  # type: ignore[misc, assignment]


class _ScenarioLoader(_Loader):  # type: ignore[misc, valid-type]
    """A safe loader that refuses duplicate keys, deep nesting and alias bombs.

    Every node is measured as it is composed: its size and depth *after*
    alias expansion, from the sizes of its children, so an alias costs what it
    would expand to while nothing is ever expanded. The running total of the
    document stops composition as soon as it passes :data:`MAX_NODES`.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._total = 0
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, depth)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._measured:
                raise ScenarioError(f"line {mark.line + 1}", "a YAML alias refers to itself")
            self._count(self._measured[id(node)][0], mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _too_deep(mark)
        self._count(1, mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._measure(node)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        self._refuse_duplicate_keys(node)
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._total += nodes
        if self._total > MAX_NODES:
            raise ScenarioError(
                f"line {mark.line + 1}",
                f"the document expands to more than {MAX_NODES:,} nodes (through YAML aliases "
                "or sheer size); refusing it",
            )

    def _measure(self, node: Node) -> None:
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        sizes = [self._measured[id(c)] for c in children]
        depth = 1 + max((d for _, d in sizes), default=0)
        if depth > MAX_DEPTH:
            raise _too_deep(node.start_mark)
        self._measured[id(node)] = (1 + sum(n for n, _ in sizes), depth)

    def _refuse_duplicate_keys(self, node: MappingNode) -> None:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = self.construct_object(key_node)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue
            if duplicate:
                raise ScenarioError(
                    f"line {key_node.start_mark.line + 1}", f"duplicate key {short_repr(key)}"
                )


def _too_deep(mark: Any) -> ScenarioError:
    return ScenarioError(f"line {mark.line + 1}", f"nested deeper than {MAX_DEPTH} levels")


def load_yaml(text: str) -> Any:
    """Parse one YAML document safely and within the limits of :class:`_ScenarioLoader`.

    Raises :class:`yaml.YAMLError` for a syntax error and :class:`ScenarioError`
    (without a source) for a document that breaks a limit or repeats a key.
    """
    loader = _ScenarioLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
