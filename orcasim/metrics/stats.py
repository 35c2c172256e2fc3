"""Percentiles, including exact percentiles of samples given as (value, count) pairs.

Inter-token latencies are recorded as one value per step with the number of
tokens that saw it, never token by token. :func:`weighted_percentiles` gives
exactly what ``numpy.percentile`` (linear method) would give on the expanded
sample, in memory proportional to the number of distinct pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles(x: np.ndarray, qs: Sequence[float]) -> list[float]:
    """``numpy.percentile`` (linear) of the finite values of ``x``; NaN for an empty sample."""
    x = x[np.isfinite(x)]
    if x.size == 0:
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(x, list(qs))]


def _lerp(a: float, b: float, t: float) -> float:
    # numpy's formula, which is exact at t = 0 and t = 1.
    d = b - a
    return b - d * (1.0 - t) if t >= 0.5 else a + d * t


def weighted_percentiles(
    values: np.ndarray, counts: np.ndarray, qs: Sequence[float]
) -> list[float]:
    """Percentiles of the sample where ``values[i]`` occurs ``counts[i]`` times.

    Equal to ``numpy.percentile(numpy.repeat(values, counts), qs)``.
    """
    keep = counts > 0
    if not keep.all():
        values, counts = values[keep], counts[keep]
    del keep
    if values.size == 0:
        return [float("nan")] * len(qs)
    # at millions of samples: two arrays of the sample's size (the order and the running
    # counts); the values are read only at the ranks asked for
    order = np.argsort(values, kind="stable")
    wide = int(counts.sum()) >= 2**31  # running counts past 2**31 need 64 bits
    cum = counts[order].astype(np.int64 if wide else np.int32, copy=False)
    np.cumsum(cum, out=cum)
    n = int(cum[-1])
    out = []
    for q in qs:
        virtual = (n - 1) * (np.float64(q) / 100)
        if virtual >= n - 1:
            out.append(float(values[order[-1]]))
            continue
        lo = int(np.floor(virtual))
        gamma = float(virtual - lo)
        # value at 0-based rank k of the expanded sample
        a = values[order[np.searchsorted(cum, lo, side="right")]]
        b = values[order[np.searchsorted(cum, lo + 1, side="right")]]
        out.append(_lerp(float(a), float(b), gamma))
    return out


def weighted_mean(values: np.ndarray, counts: np.ndarray) -> float:
    """Mean of the expanded sample; NaN when it is empty."""
    n = counts.sum()
    return float(np.dot(values, counts) / n) if n > 0 else float("nan")
