"""Compare two sweeps point by point: differences of means, their CIs, and significance.

Two sweeps are matched on the parameters that both vary (the grid
dimensions). A parameter with a single value in each sweep (say the variant
``continuous`` in one and ``sarathi`` in the other, or a fixed
``policy.max_batch``) is what differs between them, not a dimension. For each
matched point and metric: the means of A and B over their runs, the
difference ``B - A`` with a 95% Welch t-interval, and the two-sided
Mann-Whitney U test on the per-run values (no normality assumption);
significant when ``p < alpha``. With few runs the test cannot reach small p
values (with 3 runs each, the smallest possible p is 0.1), so use enough seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from orcasim.errors import UsageError
from orcasim.experiments.stats import format_pm

if TYPE_CHECKING:
    import pandas as pd


def welch_interval(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """``(B - A, half-width)`` of the Welch t-interval for the difference of means."""
    from scipy import stats

    diff = float(b.mean() - a.mean())
    if a.size < 2 or b.size < 2:
        return diff, math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    if se2 == 0:
        return diff, 0.0
    dof = se2**2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return diff, float(stats.t.ppf(0.5 + level / 2, dof)) * math.sqrt(se2)


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value (1.0 when every value is equal; NaN without data)."""
    from scipy import stats

    if a.size == 0 or b.size == 0:
        return math.nan
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _load(x: pd.DataFrame | str | Path) -> tuple[pd.DataFrame, list[str]]:
    from orcasim.experiments.store import META_COLUMNS, SweepStore

    if isinstance(x, (str, Path)):
        store = SweepStore(x)
        params = list(store.manifest()["params"])
        return store.results(), params
    df = x
    cols = list(df.columns)
    return df, cols[len(META_COLUMNS): cols.index("status")]


def matching_params(a: pd.DataFrame, pa: list[str], b: pd.DataFrame, pb: list[str]) -> list[str]:
    """The parameters both sweeps vary; an error if one varies a parameter the other fixes."""
    varied_a = [p for p in pa if a[p].nunique(dropna=False) > 1]
    varied_b = [p for p in pb if b[p].nunique(dropna=False) > 1]
    for p in varied_a:
        if p not in varied_b:
            raise UsageError(f"sweep A varies {p} but sweep B does not: compare sweeps over "
                               "the same grid")
    for p in varied_b:
        if p not in varied_a:
            raise UsageError(f"sweep B varies {p} but sweep A does not: compare sweeps over "
                               "the same grid")
    return varied_a


def compare(
    a: pd.DataFrame | str | Path,
    b: pd.DataFrame | str | Path,
    metrics: Sequence[str] | None = None,
    *,
    alpha: float = 0.05,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per matched point and metric: means, ``diff`` (B - A) with CI, ``p``, significance.

    ``a`` and ``b`` are sweep directories or results tables.
    """
    import pandas as pd

    from orcasim.experiments.stats import t_interval

    da, pa = _load(a)
    db, pb = _load(b)
    keys = matching_params(da, pa, db, pb)
    da, db = da[da["status"] == "ok"], db[db["status"] == "ok"]
    if metrics is None:
        from orcasim.commands.sweep import SUMMARY_METRICS

        metrics = [m for m in SUMMARY_METRICS if m in da.columns and m in db.columns]
    for m in metrics:
        if m not in da.columns or m not in db.columns:
            raise UsageError(f"metric {m!r} is not in both sweeps")
    groups_b = dict(iter(db.groupby(keys, sort=False))) if keys else {(): db}
    rows = []
    for key, ga in (da.groupby(keys, sort=False) if keys else [((), da)]):
        gb = groups_b.get(key)
        if gb is None:
            continue
        point = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        for m in metrics:
            va = pd.to_numeric(ga[m], errors="coerce").to_numpy(np.float64)
            vb = pd.to_numeric(gb[m], errors="coerce").to_numpy(np.float64)
            va, vb = va[np.isfinite(va)], vb[np.isfinite(vb)]
            if va.size == 0 or vb.size == 0:
                continue
            ma, lo_a, hi_a = t_interval(va, level)
            mb, lo_b, hi_b = t_interval(vb, level)
            diff, hw = welch_interval(va, vb, level)
            p = mann_whitney_p(va, vb)
            rows.append({**point, "metric": m, "n_a": va.size, "n_b": vb.size,
                         "mean_a": ma, "ci_a": (hi_a - lo_a) / 2, "mean_b": mb,
                         "ci_b": (hi_b - lo_b) / 2, "diff": diff, "diff_ci": hw,
                         "rel_diff": diff / ma if ma else math.nan, "p_value": p,
                         "significant": bool(p < alpha)})
    if not rows:
        raise UsageError("the two sweeps have no grid point in common")
    return pd.DataFrame(rows)


def format_comparison(cmp: pd.DataFrame, alpha: float = 0.05) -> str:
    """The comparison as a text table, ``12.3 ± 0.4`` cells."""
    keys = list(cmp.columns[: list(cmp.columns).index("metric")])
    out = cmp[[*keys, "metric"]].copy()
    out["A"] = [format_pm(m, h) for m, h in zip(cmp["mean_a"], cmp["ci_a"], strict=True)]
    out["B"] = [format_pm(m, h) for m, h in zip(cmp["mean_b"], cmp["ci_b"], strict=True)]
    out["B - A"] = [format_pm(m, h) for m, h in zip(cmp["diff"], cmp["diff_ci"], strict=True)]
    out["change"] = [f"{r:+.1%}" if math.isfinite(r) else "-" for r in cmp["rel_diff"]]
    out["p (MWU)"] = [f"{p:.3g}" for p in cmp["p_value"]]
    out[f"p<{alpha:g}"] = ["yes" if s else "no" for s in cmp["significant"]]
    return str(out.to_string(index=False))
