"""Confidence intervals, their formatting, replication tables and sweep comparisons."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from orcasim.experiments.comparison import compare, mann_whitney_p, welch_interval
from orcasim.experiments.stats import aggregate, bootstrap_interval, format_pm, pm_table, t_interval


def test_t_interval_by_hand():
    mean, lo, hi = t_interval([1, 2, 3, 4, 5])
    hw = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) * s / sqrt(n)
    assert mean == 3.0 and lo == pytest.approx(3 - hw, rel=1e-12) and hi == pytest.approx(
        3 + hw, rel=1e-12)
    assert t_interval([7.0])[0] == 7.0 and math.isnan(t_interval([7.0])[1])
    assert all(math.isnan(v) for v in t_interval([np.nan]))
    assert t_interval([1, 2, np.nan, 3, 4, 5]) == t_interval([1, 2, 3, 4, 5])


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    x = np.random.default_rng(0).lognormal(0, 1, 30)
    m, lo, hi = bootstrap_interval(x)
    assert (m, lo, hi) == bootstrap_interval(x)
    assert lo < m < hi and m == x.mean()
    assert bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


@pytest.mark.parametrize(("mean", "hw", "text"), [
    (12.34, 0.41, "12.3 ± 0.4"),
    (12.34, 0.15, "12.34 ± 0.15"),
    (198.496, 1.96, "198 ± 2"),
    (1234.5, 37, "1230 ± 40"),
    (0.0123, 0.00042, "0.0123 ± 0.0004"),
    (5.0, 0.0, "5 ± 0"),
    (3.0, math.nan, "3"),
    (math.nan, 1.0, "-"),
    (-0.3, 20.0, "0 ± 20"),
])
def test_format_pm(mean, hw, text):
    assert format_pm(mean, hw) == text


def runs(values: dict[tuple[float, str], list[float]]) -> pd.DataFrame:
    rows = []
    for (rate, variant), xs in values.items():
        for i, x in enumerate(xs):
            rows.append({"run_id": f"{rate}{variant}{i}", "point_id": f"{rate}{variant}",
                         "seed": i, "rep": i, "rate": rate, "variant": variant,
                         "status": "ok", "m": x})
    return pd.DataFrame(rows)


def test_aggregate_and_table():
    df = runs({(1.0, "a"): [1, 2, 3, 4, 5], (2.0, "a"): [10, 10, 10, 10, 10]})
    df.loc[len(df)] = {**df.iloc[0].to_dict(), "status": "error", "m": 1e9}  # not counted
    agg = aggregate(df, ["rate", "variant"], ["m"])
    assert agg[["rate", "variant", "metric", "n", "mean"]].values.tolist() == [
        [1.0, "a", "m", 5, 3.0], [2.0, "a", "m", 5, 10.0]]
    assert agg["half_width"].iloc[0] == pytest.approx(1.963243161, rel=1e-9)
    table = pm_table(agg, ["rate", "variant"], ["m"])
    assert table.values.tolist() == [[1.0, "a", 5, "3 ± 2"], [2.0, "a", 5, "10 ± 0"]]


def test_welch_interval_matches_scipy():
    a = np.array([1.0, 2.0, 4.0, 3.5, 2.2])
    b = np.array([3.0, 4.5, 5.0, 6.1, 4.4, 5.2])
    diff, hw = welch_interval(a, b)
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx((ci.low + ci.high) / 2, rel=1e-12)
    assert hw == pytest.approx((ci.high - ci.low) / 2, rel=1e-12)
    assert mann_whitney_p(a, b) == stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
    assert mann_whitney_p(np.ones(3), np.ones(3)) == 1.0


def test_compare_matches_points_and_flags_significance():
    a = runs({(1.0, "x"): [1, 2, 3, 4, 5, 6], (2.0, "x"): [5, 6, 7, 8, 9, 10]})
    b = runs({(1.0, "y"): [1.5, 2.5, 3.5, 4.5, 5.5, 6.5], (2.0, "y"): [20, 21, 22, 23, 24, 25]})
    cmp = compare(a, b, ["m"], paired=False)
    assert cmp["rate"].tolist() == [1.0, 2.0]  # the variant differs: it is the treatment
    assert cmp["diff"].tolist() == [0.5, 15.0]
    assert cmp["significant"].tolist() == [False, True]
    assert cmp["p_value"].iloc[1] == pytest.approx(stats.ttest_ind(
        [20, 21, 22, 23, 24, 25], [5, 6, 7, 8, 9, 10], equal_var=False).pvalue, rel=1e-12)
    assert cmp["p_rank"].iloc[1] == stats.mannwhitneyu(
        [5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24, 25], alternative="two-sided").pvalue
    paired = compare(a, b, ["m"])  # same seeds: each run of A has its run of B
    assert (paired["test"] == "paired t").all()
    assert paired["significant"].tolist() == [True, True]  # every pair moves by exactly 0.5, 15
    other = runs({(1.0, "x"): [1, 2], (1.0, "z"): [2, 3]})
    with pytest.raises(Exception, match="sweep B varies variant but sweep A does not"):
        compare(a[a.rate == 1.0], other, ["m"])
