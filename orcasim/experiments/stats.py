"""Replication statistics: means with 95% confidence intervals, and their formatting.

A sweep runs every grid point with several seeds. Each metric of a point is
then summarised across its replications by the mean and a confidence
interval: Student's t-interval by default (the replications are independent
runs), or a bootstrap interval from :func:`scipy.stats.bootstrap` (useful for
tail percentiles, whose per-run values can be skewed). Tables print
``12.3 ± 0.4``: the half-width rounded to one significant digit (two when it
starts with a 1) and the mean rounded to the same place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Method = Literal["t", "bootstrap"]


def t_interval(x: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the t-interval of the mean of the finite values of ``x``.

    With one value the bounds are NaN; with zero values everything is NaN.
    """
    from scipy import stats

    a = np.asarray(x, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(a.mean())
    if a.size == 1:
        return m, math.nan, math.nan
    se = float(a.std(ddof=1)) / math.sqrt(a.size)
    hw = float(stats.t.ppf(0.5 + level / 2, a.size - 1)) * se
    return m, m - hw, m + hw


def bootstrap_interval(
    x: Sequence[float] | np.ndarray, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: a BCa bootstrap interval of the mean (percentile when BCa fails)."""
    from scipy import stats

    a = np.asarray(x, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(a.mean())
    if a.size == 1 or np.all(a == a[0]):
        return m, (math.nan if a.size == 1 else m), (math.nan if a.size == 1 else m)
    rng = np.random.default_rng(seed)
    try:
        res = stats.bootstrap((a,), np.mean, confidence_level=level, n_resamples=2000,
                              method="BCa", random_state=rng)
    except ValueError:
        res = stats.bootstrap((a,), np.mean, confidence_level=level, n_resamples=2000,
                              method="percentile", random_state=rng)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return m, lo, hi


def interval(
    x: Sequence[float] | np.ndarray, level: float = 0.95, method: Method = "t"
) -> tuple[float, float, float]:
    """``(mean, low, high)`` by ``method`` (``"t"`` or ``"bootstrap"``)."""
    if method == "t":
        return t_interval(x, level)
    if method == "bootstrap":
        return bootstrap_interval(x, level)
    raise ValueError(f'"method" must be "t" or "bootstrap", not {method!r}')


def format_pm(mean: float, half_width: float) -> str:
    """``12.3 ± 0.4``: the half-width to 1 significant digit (2 if it starts with 1)."""
    if not math.isfinite(mean):
        return "-"
    if not math.isfinite(half_width):
        return _plain(mean)
    if half_width == 0:
        return f"{_plain(mean)} ± 0"
    sig = 1
    r = float(f"{abs(half_width):.1g}")
    if f"{r:.1e}".startswith("1"):  # 0.14 -> 0.14, not 0.1
        sig = 2
        r = float(f"{abs(half_width):.2g}")
    digits = -math.floor(math.log10(r)) + sig - 1
    d = max(digits, 0)
    m = round(mean, digits) + 0.0  # + 0.0: no "-0"
    return f"{m:.{d}f} ± {round(r, digits):.{d}f}"


def _plain(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def aggregate(
    runs: pd.DataFrame,
    by: Sequence[str],
    metrics: Sequence[str],
    *,
    level: float = 0.95,
    method: Method = "t",
) -> pd.DataFrame:
    """Long table of ``by..., metric, n, mean, low, high, half_width`` over the runs of each group.

    Only runs with ``status == "ok"`` count (when the column is there).
    """
    import pandas as pd

    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    rows = []
    if df.empty:
        return pd.DataFrame(columns=[*by, "metric", "n", "mean", "low", "high", "half_width"])
    groups = df.groupby(list(by), sort=False, dropna=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            if m not in g.columns:
                continue
            vals = pd.to_numeric(g[m], errors="coerce").to_numpy(dtype=np.float64)
            mean, lo, hi = interval(vals, level, method)
            n = int(np.isfinite(vals).sum())
            rows.append({**dict(zip(by, key, strict=True)), "metric": m, "n": n, "mean": mean,
                         "low": lo, "high": hi, "half_width": (hi - lo) / 2})
    return pd.DataFrame(rows)


def pm_table(agg: pd.DataFrame, by: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """Wide table: one row per group, one ``12.3 ± 0.4`` cell per metric (and ``n``)."""
    import pandas as pd

    if agg.empty:
        return pd.DataFrame(columns=[*by, "n", *metrics])
    agg = agg.assign(cell=[format_pm(m, h) for m, h in zip(agg["mean"], agg["half_width"],
                                                             strict=True)])
    keys = list(by)
    wide = agg.pivot_table(index=keys, columns="metric", values="cell", aggfunc="first",
                           sort=False) if keys else agg.set_index("metric")[["cell"]].T
    n = agg.groupby(keys, sort=False)["n"].max() if keys else pd.Series([agg["n"].max()])
    wide = wide.reindex(columns=[m for m in metrics if m in wide.columns])
    wide.insert(0, "n", n.to_numpy())
    wide.columns.name = None
    return wide.reset_index() if keys else wide.reset_index(drop=True)


Adjust = Literal["holm", "bh", "none"]
ADJUST_METHODS: tuple[Adjust, ...] = ("holm", "bh", "none")


def adjust_pvalues(p: Sequence[float] | np.ndarray, method: Adjust = "holm") -> np.ndarray:
    """P-values adjusted for testing them all at once (NaN entries are left out and stay NaN).

    ``"holm"`` controls the family-wise error rate (the chance of any false
    positive among the rows) under any dependence between the tests, which
    suits the rows of one comparison: they share runs. ``"bh"``
    (Benjamini-Hochberg) controls the expected share of false positives among
    the rows called significant, and rejects more. ``"none"`` returns ``p``.
    """
    p = np.asarray(p, dtype=np.float64)
    if method not in ADJUST_METHODS:
        raise ValueError(f'"method" must be one of {", ".join(ADJUST_METHODS)}, not {method!r}')
    out = p.copy()
    ok = np.isfinite(p)
    if method == "none" or not ok.any():
        return out
    out[ok] = _holm(p[ok]) if method == "holm" else _benjamini_hochberg(p[ok])
    return out


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down: the i-th smallest p times ``m - i + 1``, made non-decreasing."""
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg's step-up adjustment, from :func:`scipy.stats.false_discovery_control`."""
    from scipy import stats

    return np.asarray(stats.false_discovery_control(p, method="bh"), dtype=np.float64)
