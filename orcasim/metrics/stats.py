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
    finite = np.isfinite(x)
    if not finite.all():  # a copy only when something is left out
        x = x[finite]
    del finite
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
    n = int(counts.sum())
    spots = []  # per q: the 0-based ranks of the expanded sample it reads, and the weight
    for q in qs:
        virtual = (n - 1) * (np.float64(q) / 100)
        if virtual >= n - 1:
            spots.append((n - 1, None, 0.0))
            continue
        lo = int(np.floor(virtual))
        spots.append((lo, lo + 1, float(virtual - lo)))
    ranks = sorted({r for lo, hi, _ in spots for r in (lo, hi) if r is not None})
    if values.size > SELECT_ABOVE and _selectable(values):
        at = _select(values, counts, ranks)
    else:
        at = _sorted_at(values, counts, ranks, n)
    return [at[lo] if hi is None else _lerp(at[lo], at[hi], g) for lo, hi, g in spots]


#: pairs above which :func:`weighted_percentiles` selects its ranks in radix passes
#: (memory: a few arrays of a million) instead of sorting (12 bytes a pair)
SELECT_ABOVE = 1 << 22
_CHUNK = 1 << 20
_SIGN = np.uint64(1 << 63)
#: a radix bucket with at most this many pairs is gathered and sorted
_GATHER = 1 << 16


def _sorted_at(values: np.ndarray, counts: np.ndarray, ranks: list[int], n: int
               ) -> dict[int, float]:
    """The value at each 0-based rank of the expanded sample, through a stable sort."""
    order = np.argsort(values, kind="stable")
    cum = counts[order].astype(np.int64 if n >= 2**31 else np.int32, copy=False)
    np.cumsum(cum, out=cum)
    return {r: float(values[order[np.searchsorted(cum, r, side="right")]]) for r in ranks}


def _selectable(values: np.ndarray) -> bool:
    """Finite values without a -0.0 (which a sort does not tell from 0.0, but a key does)."""
    return bool(np.isfinite(values).all()) and not bool((values.view(np.uint64) == _SIGN).any())


def _keys(v: np.ndarray) -> np.ndarray:
    """Unsigned keys in the order of the (finite) float64 values ``v``."""
    u = v.view(np.uint64)
    return np.where(u >= _SIGN, ~u, u | _SIGN)


def _value(key: int) -> float:
    u = key ^ (1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([u], dtype=np.uint64).view(np.float64)[0])


def _select(values: np.ndarray, counts: np.ndarray, ranks: list[int]) -> dict[int, float]:
    """The value at each 0-based rank of the expanded sample (finite values), found 16 bits of
    its sort key at a time: each pass over the pairs, a chunk at a time, counts the tokens
    per next 16 bits among the keys that share the bits found so far, until few pairs share
    them; those are sorted."""
    # per rank: (bits found, key >> (64 - bits), rank among the keys with that prefix)
    todo = {r: (0, 0, r) for r in ranks}
    out: dict[int, float] = {}
    size = {(0, 0): values.size}  # pairs per prefix
    while todo:
        groups = {(b, p) for b, p, _ in todo.values()}
        hist = {g: (np.zeros(65536), np.zeros(65536, np.int64)) for g in groups
                if size[g] > _GATHER}
        found: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {
            g: [] for g in groups if size[g] <= _GATHER}
        for lo in range(0, values.size, _CHUNK):
            keys = _keys(values[lo:lo + _CHUNK])
            c = counts[lo:lo + _CHUNK]
            for (bits, prefix), (w, k) in hist.items():
                kk, cc = keys, c
                if bits:
                    m = (keys >> np.uint64(64 - bits)) == np.uint64(prefix)
                    kk, cc = keys[m], c[m]
                sub = ((kk >> np.uint64(48 - bits)) & np.uint64(0xFFFF)).astype(np.intp)
                w += np.bincount(sub, weights=cc, minlength=65536)
                k += np.bincount(sub, minlength=65536)
            for (bits, prefix), parts in found.items():
                m = (keys >> np.uint64(64 - bits)) == np.uint64(prefix)
                parts.append((keys[m], c[m]))
        for r, (bits, prefix, rest) in list(todo.items()):
            g = (bits, prefix)
            if g in found:
                keys = np.concatenate([k for k, _ in found[g]])
                cnt = np.concatenate([c for _, c in found[g]])
                order = np.argsort(keys, kind="stable")
                cum = np.cumsum(cnt[order], dtype=np.int64)
                out[r] = _value(int(keys[order[np.searchsorted(cum, rest, side="right")]]))
                del todo[r]
                continue
            w, k = hist[g]
            cum = np.cumsum(w)
            b = int(np.searchsorted(cum, rest, side="right"))
            rest -= int(cum[b - 1]) if b else 0
            nxt = (bits + 16, (prefix << 16) | b)
            if nxt[0] == 64:
                out[r] = _value(nxt[1])
                del todo[r]
                continue
            size[nxt] = int(k[b])
            todo[r] = (*nxt, rest)
    return out


def weighted_mean(values: np.ndarray, counts: np.ndarray) -> float:
    """Mean of the expanded sample; NaN when it is empty."""
    n = counts.sum()
    return float(np.dot(values, counts) / n) if n > 0 else float("nan")
