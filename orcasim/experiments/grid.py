"""Sweep planning: grid points, their ids, and the seed of every replication.

A grid maps dotted scenario fields (``workload.arrival.rate``) and the
special key ``variant`` to lists of values; the sweep runs every
combination (a point) ``seeds`` times. When the grid does not name
``variant``, every variant of the scenario is a point of its own.

Seeds: replication ``i`` of a point runs with a seed drawn from
``numpy.random.SeedSequence([base_seed, point_key, i])``, where the point key
is a hash of the point's settings without its variant. So a run's seed does
not depend on the order runs execute in or how many workers there are, and
the variants of one point see the very same requests (a paired comparison).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from orcasim.errors import ScenarioError, UsageError
from orcasim.scenario import Scenario, VariantConfig

VARIANT = "variant"


@dataclass(frozen=True)
class Point:
    """One combination of grid values (always including ``variant``)."""

    index: int
    params: dict[str, Any]
    point_id: str


@dataclass
class Task:
    """One run: a point, a replication index and its seed."""

    point: Point
    rep: int
    seed: int
    keep_requests: bool
    cfg: VariantConfig | None = None
    run_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """``"workload.arrival.rate=1,2,4"`` -> ``("workload.arrival.rate", [1, 2, 4])``.

    Values are parsed as YAML; a value list in brackets (``key=[[1, 2], [3]]``)
    is parsed whole, for values that contain commas.
    """
    if "=" not in text:
        raise UsageError(f"--grid {text!r}: expected FIELD=VALUE1,VALUE2,...")
    key, _, rest = text.partition("=")
    key = key.strip()
    if not key:
        raise UsageError(f"--grid {text!r}: the field name is empty")
    rest = rest.strip()
    try:
        if rest.startswith("["):
            values = yaml.safe_load(rest)
            if not isinstance(values, list):
                raise UsageError(f"--grid {key}: expected a list of values")
        else:
            values = [yaml.safe_load(v) if v.strip() else None for v in rest.split(",")]
    except yaml.YAMLError:
        raise UsageError(f"--grid {key}: cannot parse the values {rest!r}") from None
    if not values:
        raise UsageError(f"--grid {key}: needs at least one value")
    return key, values


def _normal(x: Any) -> Any:
    """Equal numbers written differently (``10`` and ``10.0``) get one spelling."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, dict):
        return {str(k): _normal(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_normal(v) for v in x]
    return x


def _canonical(x: Any) -> str:
    return json.dumps(_normal(x), sort_keys=True, default=repr, separators=(",", ":"))


def _digest(x: Any, n: int) -> str:
    return hashlib.sha1(_canonical(x).encode()).hexdigest()[:n]


def derive_seed(base_seed: int, params: Mapping[str, Any], rep: int) -> int:
    """The seed of replication ``rep`` of the point ``params`` (its variant ignored)."""
    key = {k: v for k, v in params.items() if k != VARIANT}
    point_key = int(_digest(key, 15), 16)
    state = np.random.SeedSequence([base_seed, point_key, rep]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))  # 63 bits: fits an int64 column


def expand(grid: Mapping[str, Sequence[Any]], variant_names: Sequence[str]) -> list[Point]:
    """Every combination of the grid's values, in order (the last key varies fastest).

    ``variant`` is added as the last key with every variant when the grid does
    not name it.
    """
    keys = list(grid)
    values = [list(grid[k]) for k in keys]
    if VARIANT not in grid:
        keys.append(VARIANT)
        values.append(list(variant_names))
    points = []
    for i, combo in enumerate(itertools.product(*values)):
        params = dict(zip(keys, combo, strict=True))
        points.append(Point(i, params, _digest(params, 10)))
    return points


def run_key(cfg: VariantConfig, seed: int) -> str:
    """A run's identity: its resolved configuration and seed (a changed scenario is a new run)."""
    conf = cfg.to_dict()
    conf["seed"] = seed
    return _digest({"variant": cfg.name, "config": conf}, 16)


def check_grid(grid: Mapping[str, Sequence[Any]]) -> None:
    """Every key has values and none twice (``4`` and ``4.0`` are one value); else a
    :class:`ScenarioError` naming the key."""
    for key, values in grid.items():
        if not values:
            raise ScenarioError(f"grid {key}", "needs at least one value")
        seen: dict[str, Any] = {}
        for v in values:
            c = _canonical(v)
            if c in seen:
                same = (f"{v!r} is given twice" if repr(v) == repr(seen[c])
                        else f"{seen[c]!r} and {v!r} are the same value")
                raise ScenarioError(f"grid {key}", f"{same}: each point would run twice")
            seen[c] = v


def plan(
    scenario: Scenario,
    grid: Mapping[str, Sequence[Any]],
    seeds: int,
    base_seed: int,
    keep_requests: int,
) -> tuple[list[Point], list[Task]]:
    """The points and the runs of a sweep, point by point.

    Every point's configuration is built here, before anything runs: a point
    that does not validate is a :class:`ScenarioError` naming the grid key and
    value at fault (or the whole point, when only the combination is wrong).
    """
    points = expand(grid, scenario.variant_names)
    scenarios: dict[str, Scenario] = {}
    tasks: list[Task] = []
    for p in points:
        cfg = _point_config(scenario, p.params, scenarios)
        for rep in range(seeds):
            seed = derive_seed(base_seed, p.params, rep)
            t = Task(p, rep, seed, rep < keep_requests, cfg)
            t.run_id = run_key(cfg, seed)
            tasks.append(t)
    return points, tasks


def _point_config(
    scenario: Scenario, params: Mapping[str, Any], cache: dict[str, Scenario]
) -> VariantConfig:
    """The configuration of the point ``params``; ``cache`` holds the scenario of each
    setting of the non-variant keys, built once for all of its variants."""
    overrides = {k: v for k, v in params.items() if k != VARIANT}
    key = repr(list(overrides.items()))
    if key not in cache:
        try:
            cache[key] = scenario.override(overrides)
        except ScenarioError as err:
            raise _culprit(scenario, overrides, err) from None
    variant = params[VARIANT]
    try:
        return cache[key].variant(str(variant))
    except KeyError:
        raise ScenarioError(f"grid {VARIANT}={variant!r}", f"no variant {variant!r} (have: "
                            f"{', '.join(scenario.variant_names)})", scenario.source) from None


def _culprit(scenario: Scenario, overrides: Mapping[str, Any], err: ScenarioError) -> ScenarioError:
    """``err`` naming the grid key and value that fail on their own (else the whole point)."""
    where = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    for k, v in overrides.items():
        try:
            scenario.override({k: v})
        except ScenarioError as alone:
            err, where = alone, f"{k}={v!r}"
            break
    detail = f"{err.field}: {err.message}" if err.field else err.message
    return ScenarioError(f"grid {where}", detail, err.source or scenario.source)
