"""Request labels for synthetic workloads: classes and tenants by share, deadlines by class.

Labels are drawn *after* the arrival and length columns, from the same
generator, so adding them to a scenario leaves its arrivals and lengths
unchanged (and a workload without labels draws nothing more).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, model_validator

from orcasim.params import ComponentParams


class LabelParams(ComponentParams):
    """Optional per-request labels of a synthetic workload."""

    classes: dict[str, float] | None = Field(
        None, description="class -> share of the requests, e.g. {interactive: 0.5, batch: 0.5}")
    tenants: dict[str, float] | None = Field(
        None, description="tenant -> share of the requests")
    deadline: float | dict[str, float] | None = Field(
        None, description="latency target, s after arrival: one for all, or class -> seconds")

    @model_validator(mode="after")
    def _check(self) -> LabelParams:
        for name in ("classes", "tenants"):
            shares = getattr(self, name)
            if shares is not None:
                if not shares:
                    raise ValueError(f"{name}: give at least one name with its share")
                bad = [k for k, v in shares.items() if not v > 0]
                if bad:
                    raise ValueError(f"{name}: the share of {bad[0]!r} must be > 0")
        d = self.deadline
        if isinstance(d, dict):
            if self.classes is None:
                raise ValueError("deadline: a per-class mapping needs classes")
            unknown = [k for k in d if k not in self.classes]
            if unknown:
                raise ValueError(f"deadline: {unknown[0]!r} is not one of the classes")
            bad = [k for k, v in d.items() if not v > 0]
            if bad:
                raise ValueError(f"deadline: the deadline of {bad[0]!r} must be > 0")
        elif d is not None and not d > 0:
            raise ValueError("deadline must be > 0")
        return self


def draw_shares(rng: np.random.Generator, n: int, shares: dict[str, float]) -> list[str]:
    """``n`` names drawn independently with probabilities proportional to ``shares``."""
    names = list(shares)
    p = np.array([shares[k] for k in names], dtype=np.float64)
    idx = rng.choice(len(names), size=n, p=p / p.sum())
    return [names[i] for i in idx.tolist()]


def draw_labels(rng: np.random.Generator, n: int, p: Any) -> dict[str, list[Any]]:
    """The workload attributes (``cls``, ``tenant``, ``deadline``) that ``p`` asks for."""
    attrs: dict[str, list[Any]] = {}
    if p.classes is not None:
        attrs["cls"] = draw_shares(rng, n, p.classes)
    if p.tenants is not None:
        attrs["tenant"] = draw_shares(rng, n, p.tenants)
    d = p.deadline
    if isinstance(d, dict):
        attrs["deadline"] = [d.get(c) for c in attrs["cls"]]
    elif d is not None:
        attrs["deadline"] = [float(d)] * n
    return attrs
