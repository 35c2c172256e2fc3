"""The workload interface and the arrays every workload produces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from orcasim.errors import OrcasimError
from orcasim.params import ComponentParams
from orcasim.request import Request


@dataclass
class WorkloadArrays:
    """Requests as columns, sorted by arrival time (seconds from the start of the run).

    ``attrs`` holds optional per-request attributes by name, one value per
    request (``name``, ``priority``, ``cls``, ``tenant``, ``deadline``, ``n``,
    ``beam_width``, ``prefix_id``, ``prefix_len``, ``hash_ids``,
    ``hash_block_size``, ``session``: see :attr:`Request.WORKLOAD_ATTRS`).
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    attrs: dict[str, Sequence[Any]] = field(default_factory=dict)

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
        for key, col in self.attrs.items():
            if key not in Request.WORKLOAD_ATTRS:
                raise OrcasimError(f"{source}: unknown request attribute {key!r}")
            if len(col) != n:
                raise OrcasimError(f"{source}: attribute {key} has {len(col)} rows, expected {n}")
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
