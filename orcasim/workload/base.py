"""The workload interface and the arrays every workload produces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from orcasim.errors import OrcasimError
from orcasim.params import ComponentParams


@dataclass
class WorkloadArrays:
    """Requests as columns, sorted by arrival time (seconds from the start of the run).

    ``name``, ``priority`` and ``tenant`` are optional per-request attributes;
    ``None`` means "not set" for every request.
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    name: list[str] | None = None
    priority: np.ndarray | None = None
    tenant: list[str] | None = None

    def __len__(self) -> int:
        return len(self.arrival)

    def check(self, source: str = "workload") -> None:
        """Raise :class:`OrcasimError` naming the first bad request, if any."""
        n = len(self.arrival)
        for col in ("prompt_len", "output_len"):
            if len(getattr(self, col)) != n:
                raise OrcasimError(f"{source}: {col} has {len(getattr(self, col))} rows, "
                                   f"arrival has {n}")
        if n == 0:
            raise OrcasimError(f"{source}: the workload has no requests")
        bad = np.flatnonzero(~np.isfinite(self.arrival) | (self.arrival < 0))
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: arrival time "
                               f"{self.arrival[bad[0]]!r} is not a finite time >= 0")
        bad = np.flatnonzero(np.diff(self.arrival) < 0)
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0] + 1}: arrivals are not sorted")
        bad = np.flatnonzero(self.prompt_len < 0)
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: negative prompt_len")
        bad = np.flatnonzero(self.output_len < 1)
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: output_len must be >= 1")


class Workload:
    """Produces :class:`WorkloadArrays` from its parameters and a random generator."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        """Draw the requests. All randomness must come from ``rng``."""
        raise NotImplementedError
