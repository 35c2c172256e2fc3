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
    if not len(rows):
        raise ScenarioError(name, "the profile file has no rows", str(path))
    cells = [r[j] if j < len(r) else "" for r in rows]
    try:  # the whole column at once (tables hold tens of thousands of rows)
        values = np.array(cells, dtype=object).astype(float)
        if bool(np.all(np.isfinite(values) & (values >= 0))):
            return values
    except ValueError:
        pass
    for i, cell in enumerate(cells):  # the first bad cell, for the message
        try:
            v = float(cell)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(name, f"line {i + 2}: {cell.strip()!r} is not a number >= 0",
                                str(path))
    raise AssertionError("unreachable: a column that failed to convert has a bad cell")


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
    """A tree over the columns of ``keys``: one level per column, leaves the mean of ``y``.

    The rows are sorted once and grouped level by level in Python: a profile's
    attention table has tens of thousands of rows and almost all of its leaves
    hold a single measurement.
    """
    if keys.shape[1] == 0:
        return float(y.mean())
    order = np.lexsort(keys.T[::-1])  # by the first column, then the second, ...; stable
    rows = keys[order].tolist()
    ys = y[order]
    return _grouped(rows, ys, 0, len(rows), 0)


def _grouped(rows: list[list[float]], ys: np.ndarray, lo: int, hi: int, level: int
             ) -> Node | float:
    """The subtree of the sorted ``rows[lo:hi]`` (equal in the columns before ``level``)."""
    if level == len(rows[lo]):
        return float(ys[lo]) if hi - lo == 1 else float(ys[lo:hi].mean())
    values: list[float] = []
    children: list[Node | float] = []
    start = lo
    for i in range(lo + 1, hi + 1):
        if i == hi or rows[i][level] != rows[start][level]:
            values.append(rows[start][level])
            children.append(_grouped(rows, ys, start, i, level + 1))
            start = i
    return values, children


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
