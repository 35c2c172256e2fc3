"""The ``sweep:`` section of a scenario file: which settings to vary and how many seeds.

Kept apart from the sweep runner so that loading a scenario never imports
joblib, pandas or a cluster client::

    sweep:
      grid:
        workload.arrival.rate: [1, 2, 4, 8]   # any dotted scenario field
        variant: [static, continuous]         # the scenario's variants to run
      seeds: 10                               # replications per grid point
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from orcasim.params import ComponentParams


class SweepOptions(ComponentParams):
    """A grid of settings times a number of seeds (see docs/experiments.md)."""

    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="dotted scenario field (or `variant`) -> the values it takes; "
        "the sweep runs every combination",
    )
    seeds: int = Field(1, ge=1, description="replications (seeds) per grid point")
    seed: int | None = Field(
        None, ge=0, description="base seed the runs' seeds derive from (default: `seed`)"
    )
    keep_requests: int = Field(
        1, ge=0, description="replications per point whose per-request rows are kept for reports"
    )

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if not key or key.startswith(".") or key.endswith("."):
                raise ValueError(f"{key!r} is not a dotted field path")
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return grid
