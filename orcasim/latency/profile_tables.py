"""Profile tables: reading measured CSVs and interpolating between their grid points.

Shared by the profile formats :mod:`orcasim.latency.profile` reads
(LLMServingSim's and Vidur's): a checked CSV reader, a piecewise-linear
:class:`Curve` of one input, and a nested table interpolated axis by axis
(:func:`build_nested`, :func:`eval_nested`) for grids that are not full.
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_right
from pathlib import Path
from typing import Union

import numpy as np

from orcasim.errors import ScenarioError


def read_table(path: Path, text: tuple[str, ...], numeric: tuple[str, ...]
               ) -> dict[str, np.ndarray]:
    """The named columns of CSV ``path``: text columns as strings, the others as floats.

    Raises a one-line :class:`ScenarioError` naming the file and the column
    for a missing file, a missing column or a cell that is not a finite number.
    """
    cols = (*text, *numeric)
    if not path.is_file():
        raise ScenarioError(", ".join(cols), "profile file not found", str(path))
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]] if rows else []
    for c in cols:
        if c not in header:
            raise ScenarioError(c, "column missing from the profile file", str(path))
    out: dict[str, np.ndarray] = {}
    for c in text:
        j = header.index(c)
        out[c] = np.array([r[j].strip() if j < len(r) else "" for r in rows[1:]])
    for c in numeric:
        out[c] = _numeric_column(path, c, header.index(c), rows[1:])
    return out


def _numeric_column(path: Path, name: str, j: int, rows: list[list[str]]) -> np.ndarray:
    """Column ``j`` of ``rows`` as floats; a blank, non-numeric or negative cell is an error."""
    values = np.empty(len(rows))
    for i, r in enumerate(rows):
        cell = r[j].strip() if j < len(r) else ""
        try:
            v = float(cell)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(name, f"line {i + 2}: {cell!r} is not a number >= 0", str(path))
        values[i] = v
    if not len(rows):
        raise ScenarioError(name, "the profile file has no rows", str(path))
    return values


class Curve:
    """Piecewise-linear function of one input, from measured points (repeats averaged)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, clamp: bool) -> None:
        xs, inverse = np.unique(x, return_inverse=True)
        ys = np.bincount(inverse, weights=y) / np.bincount(inverse)
        self.xs: list[float] = xs.tolist()
        self.ys: list[float] = ys.tolist()
        self.clamp = clamp

    def __call__(self, v: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect_right(xs, v) - 1, 0), len(xs) - 2)
        f = (v - xs[i]) / (xs[i + 1] - xs[i])
        if self.clamp:
            f = min(max(f, 0.0), 1.0)
        return ys[i] + f * (ys[i + 1] - ys[i])


#: a node of the nested attention table: (sorted axis values, one child per value)
Node = tuple[list[float], list[Union["Node", float]]]


def build_nested(keys: np.ndarray, y: np.ndarray) -> Node | float:
    """A tree over the columns of ``keys``: one level per column, leaves the mean of ``y``."""
    if keys.shape[1] == 0:
        return float(y.mean())
    order = np.argsort(keys[:, 0], kind="stable")
    keys, y = keys[order], y[order]
    values, starts = np.unique(keys[:, 0], return_index=True)
    ends = [*starts[1:].tolist(), len(y)]
    children = [build_nested(keys[s:e, 1:], y[s:e]) for s, e in zip(starts, ends, strict=True)]
    return values.tolist(), children


def eval_nested(node: Node | float, point: tuple[float, ...], clamp: bool) -> float:
    """Axis-by-axis linear interpolation of a :func:`build_nested` tree at ``point``."""
    if not isinstance(node, tuple):
        return node
    xs, children = node
    rest = point[1:]
    if len(xs) == 1:
        return eval_nested(children[0], rest, clamp)
    v = point[0]
    i = min(max(bisect_right(xs, v) - 1, 0), len(xs) - 2)
    f = (v - xs[i]) / (xs[i + 1] - xs[i])
    if clamp:
        f = min(max(f, 0.0), 1.0)
    a = eval_nested(children[i], rest, clamp) if f != 1.0 else 0.0
    b = eval_nested(children[i + 1], rest, clamp) if f != 0.0 else 0.0
    return a + f * (b - a)


def summed_curves(table: dict[str, np.ndarray], x: str, names: list[str], clamp: bool,
                  counts: dict[str, int] | None = None) -> list[Curve]:
    """One :class:`Curve` per operator in ``names`` (time in seconds against column ``x``).

    An operator that runs ``counts[name]`` times (default once) has its
    times multiplied by that count.
    """
    curves = []
    for name in names:
        rows = table["layer"] == name
        k = (counts or {}).get(name, 1)
        curves.append(Curve(table[x][rows], table["time_us"][rows] * (k * 1e-6), clamp))
    return curves
