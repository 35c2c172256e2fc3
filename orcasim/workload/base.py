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

    Closed-loop workloads (clients, multi-turn sessions) set ``after``: the
    index of the request whose end releases this one, ``think`` seconds
    later (-1: an open-loop request, released at ``arrival``). Such a
    request's ``arrival`` is NaN until the run fixes it. A request comes
    after an earlier index, so the chains have no cycles.
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    attrs: dict[str, Sequence[Any]] = field(default_factory=dict)
    after: np.ndarray | None = None
    think: np.ndarray | None = None

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
        roots = np.arange(n)
        if self.after is not None or self.think is not None:
            roots = self._check_chains(source)
        arrival = self.arrival[roots]
        bad = np.flatnonzero(~np.isfinite(arrival) | (arrival < 0))
        if bad.size:
            raise OrcasimError(f"{source}: request {roots[bad[0]]}: arrival time "
                               f"{float(arrival[bad[0]])!r} is not a finite time >= 0")
        bad = np.flatnonzero(np.diff(arrival) < 0)
        if bad.size:
            raise OrcasimError(f"{source}: request {roots[bad[0] + 1]}: arrivals are not sorted")
        bad = np.flatnonzero(self.prompt_len < 0)
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: negative prompt_len")
        bad = np.flatnonzero(self.output_len < 1)
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: output_len must be >= 1")

    def _check_chains(self, source: str) -> np.ndarray:
        """Check ``after`` and ``think``; return the indices of the open-loop requests."""
        n = len(self.arrival)
        if self.after is None or self.think is None:
            raise OrcasimError(f"{source}: after and think must be given together")
        if len(self.after) != n or len(self.think) != n:
            raise OrcasimError(f"{source}: after and think need one value per request")
        idx = np.arange(n)
        dep = self.after >= 0
        bad = np.flatnonzero((self.after < -1) | (dep & (self.after >= idx)))
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: it must come after an earlier "
                               f"request (after = {self.after[bad[0]]})")
        bad = np.flatnonzero(dep & ~(np.isfinite(self.think) & (self.think >= 0)))
        if bad.size:
            think = float(self.think[bad[0]])
            raise OrcasimError(f"{source}: request {bad[0]}: think time {think!r} is not a "
                               "finite time >= 0")
        if np.unique(self.after[dep]).size != int(dep.sum()):
            raise OrcasimError(f"{source}: a request releases at most one other request")
        return idx[~dep]


class Workload:
    """Produces :class:`WorkloadArrays` from its parameters and a random generator."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        """Draw the requests. All randomness must come from ``rng``."""
        raise NotImplementedError
