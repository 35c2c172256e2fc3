"""Compare two sweeps point by point: differences of means, their intervals, and significance.

Two sweeps are matched on the parameters that both vary (the grid
dimensions). A parameter with a single value in each sweep (say the variant
``continuous`` in one and ``sarathi`` in the other, or a fixed
``policy.max_batch``) is what differs between them, not a dimension.

Runs are paired when they can be: a run's seed depends on its point's
settings (without the variant) and its replication index, not on what
differs between the sweeps, so run ``i`` of a point in A and run ``i`` of the
same point in B see the same requests (common random numbers). Where the two
sweeps share ``(seed, rep)`` runs at a point, the difference ``B - A`` is the
mean of the per-run differences with its t-interval, tested by the paired
t-test (:func:`scipy.stats.ttest_rel`); the Wilcoxon signed-rank test is
reported alongside, and the effect size is Cohen's ``d_z`` (mean difference
over the standard deviation of the differences). Sharing the workload removes
its run-to-run variation from the difference, which is why paired
comparisons need far fewer seeds. Where no runs pair up (other base seeds,
``paired=False``) the runs are treated as independent: Welch's t-test and
interval (:func:`scipy.stats.ttest_ind` with ``equal_var=False``), the
Mann-Whitney U test alongside, and Cohen's ``d`` over the mean of the two
variances.

The interval is at level ``1 - alpha`` and comes from the same t-test as
``p_value``, so it excludes 0 exactly when ``p_value < alpha``. A comparison
tests many rows at once, so the verdict ``significant`` uses ``p_adj``: the
t-test p-values adjusted over all rows (Holm by default, see
:func:`orcasim.experiments.stats.adjust_pvalues`). A significant row's
interval always excludes 0; a row whose interval excludes 0 can still be
not significant once the number of rows tested is accounted for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from orcasim.errors import UsageError
from orcasim.experiments.stats import ADJUST_METHODS, Adjust, adjust_pvalues, format_pm, t_interval

if TYPE_CHECKING:
    import pandas as pd

PAIRED = "paired t"
WELCH = "Welch"
#: the columns that identify a run's random numbers: its seed and replication index
PAIR_ON = ("seed", "rep")


@dataclass(frozen=True)
class Difference:
    """B - A for one metric at one point, with the test behind it.

    ``n_pairs`` is 0 for Welch rows. For paired rows the means are over the
    paired runs only, so ``diff == mean_b - mean_a``. ``p_rank`` is the
    rank test matching ``test`` (Wilcoxon signed-rank for paired rows,
    Mann-Whitney U otherwise); ``effect`` is ``d_z`` or ``d`` likewise.
    """

    test: str
    n_a: int
    n_b: int
    n_pairs: int
    mean_a: float
    ci_a: float
    mean_b: float
    ci_b: float
    diff: float
    diff_ci: float
    p_value: float
    p_rank: float
    effect: float


def _mean_ci(x: np.ndarray, level: float) -> tuple[float, float]:
    """``(mean, half-width)`` of the t-interval of ``x``'s mean."""
    m, lo, hi = t_interval(x, level)
    return m, (hi - lo) / 2


def _degenerate(diff: float) -> tuple[float, float, float]:
    """``(half-width, p, effect)`` when the difference has no spread at all.

    Every run then shows exactly ``diff``: the interval is that point, and
    the difference is either certainly zero or certainly not.
    """
    if diff == 0:
        return 0.0, 1.0, 0.0
    return 0.0, 0.0, math.copysign(math.inf, diff)


def wilcoxon_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the differences ``d``.

    NaN with fewer than 2 differences; 1.0 when every difference is zero
    (there is nothing to rank).
    """
    from scipy import stats

    d = np.asarray(d, dtype=np.float64)
    if d.size < 2:
        return math.nan
    if np.all(d == 0):
        return 1.0
    return float(stats.wilcoxon(d).pvalue)


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value (1.0 when every value is equal; NaN without data)."""
    from scipy import stats

    if a.size == 0 or b.size == 0:
        return math.nan
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def paired_difference(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> Difference:
    """The paired comparison of ``b[i]`` with ``a[i]``: mean difference, t-interval, tests.

    With one pair there is a difference but no interval or test (NaN).
    """
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = b - a
    diff = float(d.mean())
    if d.size < 2:
        hw, p, effect = math.nan, math.nan, math.nan
    elif np.all(d == d[0]):
        hw, p, effect = _degenerate(diff)
    else:
        res = stats.ttest_rel(b, a)
        ci = res.confidence_interval(level)
        hw, p = float(ci.high - ci.low) / 2, float(res.pvalue)
        effect = diff / float(d.std(ddof=1))
    (ma, ca), (mb, cb) = _mean_ci(a, level), _mean_ci(b, level)
    return Difference(PAIRED, a.size, b.size, d.size, ma, ca, mb, cb, diff, hw, p,
                      wilcoxon_p(d), effect)


def unpaired_difference(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> Difference:
    """The comparison of independent runs: difference of means, Welch interval and test.

    With fewer than 2 runs on a side there is no interval or test (NaN).
    """
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    (ma, ca), (mb, cb) = _mean_ci(a, level), _mean_ci(b, level)
    diff = float(b.mean() - a.mean())
    if a.size < 2 or b.size < 2:
        hw, p, effect = math.nan, math.nan, math.nan
    elif np.all(a == a[0]) and np.all(b == b[0]):
        hw, p, effect = _degenerate(diff)
    else:
        res = stats.ttest_ind(b, a, equal_var=False)
        ci = res.confidence_interval(level)
        hw, p = float(ci.high - ci.low) / 2, float(res.pvalue)
        effect = diff / math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    return Difference(WELCH, a.size, b.size, 0, ma, ca, mb, cb, diff, hw, p,
                      mann_whitney_p(a, b), effect)


def welch_interval(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """``(B - A, half-width)`` of the Welch t-interval for the difference of means."""
    d = unpaired_difference(a, b, level)
    return d.diff, d.diff_ci


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


def _values(g: pd.DataFrame, metric: str) -> np.ndarray:
    """The metric's finite per-run values."""
    import pandas as pd

    v = pd.to_numeric(g[metric], errors="coerce").to_numpy(np.float64)
    return v[np.isfinite(v)]


def shares_seeds(ga: pd.DataFrame, gb: pd.DataFrame) -> bool:
    """Whether the runs of A and B at one point pair up: some ``(seed, rep)`` in both, each once."""
    on = list(PAIR_ON)
    if not all(c in ga.columns and c in gb.columns for c in on):
        return False
    if ga.duplicated(on).any() or gb.duplicated(on).any():
        return False
    return bool(ga[on].merge(gb[on], on=on).shape[0])


def paired_values(
    ga: pd.DataFrame, gb: pd.DataFrame, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """The metric's values of the runs with the same ``(seed, rep)`` in A and B, pair by pair.

    A pair counts only when both of its values are finite.
    """
    import pandas as pd

    on = list(PAIR_ON)
    both = ga[[*on, metric]].merge(gb[[*on, metric]], on=on, suffixes=("_a", "_b"))
    va = pd.to_numeric(both[f"{metric}_a"], errors="coerce").to_numpy(np.float64)
    vb = pd.to_numeric(both[f"{metric}_b"], errors="coerce").to_numpy(np.float64)
    ok = np.isfinite(va) & np.isfinite(vb)
    return va[ok], vb[ok]


def _point_rows(
    point: dict[str, object], ga: pd.DataFrame, gb: pd.DataFrame, metrics: Sequence[str],
    level: float, paired: bool,
) -> list[dict[str, object]]:
    """One row per metric for one matched point (none for a metric without values)."""
    pair = paired and shares_seeds(ga, gb)
    rows = []
    for m in metrics:
        va, vb = paired_values(ga, gb, m) if pair else (_values(ga, m), _values(gb, m))
        if va.size == 0 or vb.size == 0:
            continue
        d = paired_difference(va, vb, level) if pair else unpaired_difference(va, vb, level)
        rel = d.diff / d.mean_a if d.mean_a else math.nan
        rows.append({**point, "metric": m, **asdict(d), "rel_diff": rel})
    return rows


def compare(
    a: pd.DataFrame | str | Path,
    b: pd.DataFrame | str | Path,
    metrics: Sequence[str] | None = None,
    *,
    alpha: float = 0.05,
    adjust: Adjust = "holm",
    paired: bool = True,
) -> pd.DataFrame:
    """One row per matched point and metric: means, ``diff`` (B - A) with its interval, tests.

    ``a`` and ``b`` are sweep directories or results tables. Intervals are at
    level ``1 - alpha``. Runs that share ``(seed, rep)`` are compared pair by
    pair (``test == "paired t"``) unless ``paired`` is false; otherwise by
    Welch's test. ``p_adj`` adjusts ``p_value`` over all rows by ``adjust``
    (``"holm"``, ``"bh"`` or ``"none"``) and ``significant`` is
    ``p_adj < alpha``.
    """
    import pandas as pd

    if adjust not in ADJUST_METHODS:
        raise UsageError(f"adjust must be one of {', '.join(ADJUST_METHODS)} (got {adjust!r})")
    da, pa = _load(a)
    db, pb = _load(b)
    keys = matching_params(da, pa, db, pb)
    da, db = da[da["status"] == "ok"], db[db["status"] == "ok"]
    metrics = _metrics(da, db, metrics)
    groups_b = dict(iter(db.groupby(keys, sort=False))) if keys else {(): db}
    rows = []
    for key, ga in (da.groupby(keys, sort=False) if keys else [((), da)]):
        gb = groups_b.get(key)
        if gb is not None:
            point = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            rows += _point_rows(point, ga, gb, metrics, 1 - alpha, paired)
    if not rows:
        raise UsageError("the two sweeps have no grid point in common")
    cmp = pd.DataFrame(rows)
    cmp["p_adj"] = adjust_pvalues(cmp["p_value"].to_numpy(np.float64), adjust)
    cmp["significant"] = cmp["p_adj"] < alpha
    order = [*keys, "metric", "test", "n_a", "n_b", "n_pairs", "mean_a", "ci_a", "mean_b",
             "ci_b", "diff", "diff_ci", "rel_diff", "p_value", "p_adj", "effect", "p_rank",
             "significant"]
    return cmp[order]


def _metrics(da: pd.DataFrame, db: pd.DataFrame, metrics: Sequence[str] | None) -> list[str]:
    """The metrics to compare: those asked for (each must be in both), else the standard set."""
    if metrics is None:
        from orcasim.commands.sweep import SUMMARY_METRICS

        return [m for m in SUMMARY_METRICS if m in da.columns and m in db.columns]
    for m in metrics:
        if m not in da.columns or m not in db.columns:
            raise UsageError(f"metric {m!r} is not in both sweeps")
    return list(metrics)


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if math.isfinite(p) else "-"


def _fmt_effect(e: float) -> str:
    return f"{e:+.2f}" if math.isfinite(e) else ("-" if math.isnan(e) else f"{e:+}")


def format_comparison(cmp: pd.DataFrame, alpha: float = 0.05, adjust: Adjust = "holm") -> str:
    """The comparison as a text table, ``12.3 ± 0.4`` cells.

    ``n`` is the number of pairs for paired rows and ``n_a/n_b`` for Welch
    rows; ``p`` is the t-test's, ``p_<adjust>`` its adjusted value that the
    verdict ``sig`` compares with ``alpha``.
    """
    keys = list(cmp.columns[: list(cmp.columns).index("metric")])
    out = cmp[[*keys, "metric", "test"]].copy()
    out["n"] = [str(n) if t == PAIRED else f"{na}/{nb}"
                for t, n, na, nb in zip(cmp["test"], cmp["n_pairs"], cmp["n_a"], cmp["n_b"],
                                        strict=True)]
    out["A"] = [format_pm(m, h) for m, h in zip(cmp["mean_a"], cmp["ci_a"], strict=True)]
    out["B"] = [format_pm(m, h) for m, h in zip(cmp["mean_b"], cmp["ci_b"], strict=True)]
    out["B - A"] = [format_pm(m, h) for m, h in zip(cmp["diff"], cmp["diff_ci"], strict=True)]
    out["change"] = [f"{r:+.1%}" if math.isfinite(r) else "-" for r in cmp["rel_diff"]]
    out["p"] = [_fmt_p(p) for p in cmp["p_value"]]
    out[f"p_{adjust}"] = [_fmt_p(p) for p in cmp["p_adj"]]
    out["effect"] = [_fmt_effect(e) for e in cmp["effect"]]
    out["p_rank"] = [_fmt_p(p) for p in cmp["p_rank"]]
    out["sig"] = ["yes" if s else "no" for s in cmp["significant"]]
    return str(out.to_string(index=False))
