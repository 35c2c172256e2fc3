"""``table``: step times interpolated from measurements (see :mod:`orcasim.latency.measurements`).

The table's inputs are a step's batch size, prefill tokens, decode tokens and
KV tokens. Inputs that never vary in the file (prefill always 0 in a decode
table) or that follow from the others (decode tokens = batch size) carry no
information and are dropped; repeated measurements of one point are
averaged. Then:

- if the rows form a full grid over the remaining inputs (every combination
  of their measured values present), the step time is multilinear
  interpolation in the grid cell holding the step, and linear extrapolation
  from the edge cell outside it (``extrapolate: clamp`` holds the edge
  value instead);
- otherwise (scattered measurements, e.g. steps logged from a real run), it
  is linear interpolation on the Delaunay triangulation of the points, in
  inputs scaled to unit range, and the nearest measurement outside their
  convex hull.

An interpolated time that is not a finite number > 0 stops the run with the step's numbers.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import product
from typing import Literal

import numpy as np
from pydantic import Field

from orcasim.errors import OrcasimError
from orcasim.latency.base import LatencyModel
from orcasim.latency.measurements import FEATURES, load_measurements
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models


def informative_columns(x: np.ndarray) -> list[int]:
    """Indices of the columns of ``x`` that vary and are not linear in earlier kept ones."""
    keep: list[int] = []
    scaled = x - x.mean(axis=0)
    span = np.abs(scaled).max(axis=0)
    scaled = scaled / np.where(span > 0, span, 1.0)
    rank = 0
    for j in range(x.shape[1]):
        if span[j] == 0:
            continue
        r = np.linalg.matrix_rank(scaled[:, [*keep, j]], tol=1e-9)
        if r > rank:
            keep.append(j)
            rank = r
    return keep


class _Grid:
    """Multilinear interpolation on a full grid (one axis per kept input)."""

    def __init__(self, axes: list[np.ndarray], values: np.ndarray, clamp: bool) -> None:
        self.axes = [a.tolist() for a in axes]
        self.values = values
        self.clamp = clamp
        self.corners = list(product((0, 1), repeat=len(axes)))

    def __call__(self, point: list[float]) -> float:
        lo: list[int] = []
        w: list[float] = []
        for ax, v in zip(self.axes, point, strict=True):
            if len(ax) == 1:
                lo.append(0)
                w.append(0.0)
                continue
            i = min(max(bisect_right(ax, v) - 1, 0), len(ax) - 2)
            f = (v - ax[i]) / (ax[i + 1] - ax[i])
            if self.clamp:
                f = min(max(f, 0.0), 1.0)
            lo.append(i)
            w.append(f)
        t = 0.0
        vals = self.values
        for corner in self.corners:
            weight = 1.0
            for c, f in zip(corner, w, strict=True):
                weight *= f if c else 1.0 - f
            if weight:
                t += weight * float(vals[tuple(i + c for i, c in zip(lo, corner, strict=True))])
        return t


class _Scattered:
    """Linear interpolation on a Delaunay triangulation; nearest point outside the hull."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

        self.lo = x.min(axis=0)
        self.span = x.max(axis=0) - self.lo
        z = (x - self.lo) / self.span
        if x.shape[1] == 1:
            order = np.argsort(z[:, 0])
            self.xs, self.ys = z[order, 0], y[order]
            self.linear = self.nearest = None
        else:
            self.linear = LinearNDInterpolator(z, y)
            self.nearest = NearestNDInterpolator(z, y)

    def __call__(self, point: list[float]) -> float:
        z = (np.asarray(point) - self.lo) / self.span
        if self.linear is None:
            return float(np.interp(z[0], self.xs, self.ys))
        t = float(self.linear(z[None, :])[0])
        if np.isnan(t):
            t = float(self.nearest(z[None, :])[0])
        return t


@latency_models.register("table")
class TableLatency(LatencyModel):
    """Step times interpolated from a CSV of measured steps."""

    class Params(ComponentParams):
        file: str = Field(description="CSV: batch_size, prefill_tokens, decode_tokens, "
                          "kv_tokens, seconds")
        extrapolate: Literal["linear", "clamp"] = Field(
            "linear", description="outside a grid: extend the edge cell, or hold its value")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        meas = load_measurements(params.file)
        self.source = meas.source
        keep = informative_columns(meas.x)
        self.inputs = [FEATURES[j] for j in keep]
        x = meas.x[:, keep]
        points, inverse = np.unique(x, axis=0, return_inverse=True)
        y = np.bincount(inverse.ravel(), weights=meas.seconds) / np.bincount(inverse.ravel())
        self._keep = keep
        if not keep:
            self._fn = lambda _p: float(y[0])
            self.kind = "constant"
            return
        axes = [np.unique(points[:, j]) for j in range(len(keep))]
        if len(points) == int(np.prod([len(a) for a in axes])):
            grid = np.empty([len(a) for a in axes])
            idx = tuple(np.searchsorted(a, points[:, j]) for j, a in enumerate(axes))
            grid[idx] = y
            self._fn = _Grid(axes, grid, params.extrapolate == "clamp")
            self.kind = "grid"
        else:
            self._fn = _Scattered(points, y)
            self.kind = "scattered"

    def step_time(self, plan: StepPlan) -> float:
        full = (plan.num_seqs, plan.num_prefill_tokens, plan.num_decode_tokens,
                plan.num_kv_tokens)
        t = self._fn([float(full[j]) for j in self._keep])
        if not (t > 0 and math.isfinite(t)):
            raise OrcasimError(
                f"{self.source}: the table gives {t:.6g} s for a step with batch_size "
                f"{full[0]}, prefill_tokens {full[1]}, decode_tokens {full[2]}, kv_tokens "
                f"{full[3]} (extrapolated past the measurements; add rows or use "
                "extrapolate: clamp)")
        return t
