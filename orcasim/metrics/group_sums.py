"""Sums of consecutive groups of rows, bit for bit ``numpy.add.reduceat`` but with few calls.

The bounded series (:mod:`orcasim.metrics.series`) merges rows into bins of
equal numbers of steps with ``numpy.add.reduceat``, which calls its inner
loop once per bin and column: merging 4,096 rows into bins of 8 steps is
thousands of calls for a few tens of thousands of additions. Most bins
hold the same number of rows, so the rows of a stretch of equal bins form a
``(bins, rows, columns)`` block whose sums a handful of whole-array
additions give, one per row of a bin.

The sums must be the same floats as ``reduceat``'s, which starts from a
bin's first row and adds numpy's pairwise sum of the others (a plain loop
below 8 terms, eight accumulators up to 128, halves above). :func:`_pairwise`
makes the same additions in the same order on whole columns;
:func:`_matches_reduceat` compares the two once per process on varied
numbers, and where it finds a difference (another numpy's reduction) every
sum goes through ``reduceat`` itself.
"""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import numpy as np

#: bins of at most this many rows are summed row by row (more: ``reduceat``)
MAX_ROWS = 64


def _pairwise(x: list[np.ndarray], lo: int, n: int) -> np.ndarray:
    """numpy's pairwise sum of ``x[lo:lo + n]`` (``n >= 1``), element by element of the arrays."""
    if n < 8:  # a plain loop (from -0.0, which adding leaves out)
        res = x[lo]
        for i in range(lo + 1, lo + n):
            res = res + x[i]
        return res
    if n <= 128:  # eight accumulators, combined in pairs, then the rest one by one
        r = x[lo:lo + 8]
        i = 8
        whole = n - n % 8
        while i < whole:
            r = [r[j] + x[lo + i + j] for j in range(8)]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for k in range(lo + i, lo + n):
            res = res + x[k]
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(x, lo, half) + _pairwise(x, lo + half, n - half)


def _equal_bins(block: np.ndarray, size: int) -> np.ndarray:
    """Sums of bins of ``size`` rows, ``block`` holding whole bins one after another."""
    x = block.reshape(-1, size, block.shape[1])
    cols = [x[:, j] for j in range(size)]
    return cols[0] + _pairwise(cols, 1, size - 1)


@cache
def _matches_reduceat() -> bool:
    """Whether :func:`_equal_bins` gives ``reduceat``'s floats here, on numbers of very
    different magnitudes and bins of every kind of length."""
    rng = np.random.default_rng(12345)
    for size in (2, 3, 7, 8, 9, 10, 16, 17, 25, 64, 129, 200):
        a = rng.random((4 * size, 3)) * rng.choice([1e-9, 1.0, 3e7], size=(4 * size, 3))
        want = np.add.reduceat(a, np.arange(0, len(a), size), axis=0)
        if not np.array_equal(_equal_bins(a, size), want):
            return False
    return True


def group_sums(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``numpy.add.reduceat(a, starts, axis=0)`` for a 2-D ``a`` and increasing ``starts``
    from 0: the sums of the rows from each start to the next, the same floats.

    Stretches of bins with the same number of rows are summed as blocks
    (:func:`_equal_bins`) where that takes fewer calls than ``reduceat``.
    """
    n, width = a.shape
    lengths = np.diff(starts, append=n)
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    if len(cuts) > 8 or not _matches_reduceat():  # irregular bins: reduceat as it is
        return np.add.reduceat(a, starts, axis=0)
    out = np.empty((len(starts), width))
    bounds = [0, *cuts.tolist(), len(starts)]
    for g0, g1 in pairwise(bounds):
        size = int(lengths[g0])
        s = int(starts[g0])
        e = s + (g1 - g0) * size
        if size == 1:
            out[g0:g1] = a[s:e]
        elif size <= MAX_ROWS and (g1 - g0) * width > 4 * size:
            out[g0:g1] = _equal_bins(a[s:e], size)
        else:
            out[g0:g1] = np.add.reduceat(a[s:e], np.arange(0, e - s, size), axis=0)
    return out
