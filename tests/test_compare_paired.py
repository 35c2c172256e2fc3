"""Paired comparisons of sweeps that share seeds, and the multiple-testing adjustment."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import orcasim
from orcasim.cli import main
from orcasim.experiments.comparison import (
    PAIRED,
    WELCH,
    compare,
    paired_difference,
    unpaired_difference,
    wilcoxon_p,
)
from orcasim.experiments.stats import adjust_pvalues

BASE = np.array([100.0, 120.0, 80.0, 140.0, 95.0, 110.0])
NOISE = np.array([0.01, -0.02, 0.015, -0.01, 0.0, 0.02])


def runs(values: dict[str, list[float]], variant: str, seeds: list[int] | None = None,
         **metrics: list[float]) -> pd.DataFrame:
    """A results table of one point: one run per value, seed ``i`` for run ``i``."""
    n = len(next(iter(values.values())))
    seeds = list(range(n)) if seeds is None else seeds
    rows = [{"run_id": f"{variant}{s}", "point_id": "p", "seed": s, "rep": s,
             "variant": variant, "status": "ok", **{m: v[i] for m, v in values.items()}}
            for i, s in enumerate(seeds)]
    return pd.DataFrame(rows)


def test_a_constant_shift_is_significant_paired_and_not_unpaired():
    a, b = BASE, BASE + 1.0 + NOISE
    cmp = compare(runs({"m": list(a)}, "x"), runs({"m": list(b)}, "y"), ["m"])
    row = cmp.iloc[0]
    ref = stats.ttest_rel(b, a)
    ci = ref.confidence_interval(0.95)
    assert row["test"] == PAIRED and row["n_pairs"] == 6
    assert row["diff"] == pytest.approx(np.mean(b - a), rel=1e-12)
    assert row["diff_ci"] == pytest.approx((ci.high - ci.low) / 2, rel=1e-12)
    assert row["p_value"] == pytest.approx(ref.pvalue, rel=1e-12) and row["p_value"] < 1e-9
    assert row["p_rank"] == pytest.approx(stats.wilcoxon(b - a).pvalue)
    assert row["effect"] == pytest.approx(np.mean(b - a) / np.std(b - a, ddof=1))
    assert row["significant"]

    welch = compare(runs({"m": list(a)}, "x"), runs({"m": list(b)}, "y"), ["m"], paired=False)
    w = welch.iloc[0]
    ref = stats.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert w["test"] == WELCH and w["n_pairs"] == 0
    assert w["p_value"] == pytest.approx(ref.pvalue, rel=1e-12) and w["p_value"] > 0.5
    assert w["diff_ci"] == pytest.approx((ci.high - ci.low) / 2, rel=1e-12)
    assert w["p_rank"] == stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
    assert not w["significant"]


@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.2])
def test_the_interval_excludes_zero_exactly_when_the_t_test_rejects(alpha):
    rng = np.random.default_rng(1)
    for _ in range(50):
        a = rng.normal(10, 3, 8)
        b = a + rng.normal(0.8, 1.5, 8)
        for d in (paired_difference(a, b, 1 - alpha), unpaired_difference(a, b, 1 - alpha)):
            assert (abs(d.diff) > d.diff_ci) == (d.p_value < alpha)


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> 0.06 (monotone)
    assert adjust_pvalues(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert adjust_pvalues([0.5, 0.6], "holm").tolist() == [1.0, 1.0]  # capped at 1
    got = adjust_pvalues([math.nan, 0.01, 0.04], "holm")  # NaN is not a test: m = 2
    assert math.isnan(got[0]) and got[1:] == pytest.approx([0.02, 0.04], rel=1e-12)


def test_benjamini_hochberg_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 times 4/1, 4/2, 4/3, 4/4: 0.02, 0.02, 0.04, 0.04
    assert adjust_pvalues(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02], rel=1e-12)
    # a step-up: a large p lowers nothing, the minimum from the top carries down
    assert adjust_pvalues([0.04, 0.045, 0.05], "bh") == pytest.approx([0.05] * 3, rel=1e-12)
    assert adjust_pvalues(p, "none").tolist() == p
    with pytest.raises(ValueError, match="must be one of"):
        adjust_pvalues(p, "bonferroni")  # type: ignore[arg-type]


def test_the_verdict_uses_the_adjusted_p_value():
    a = [10.0, 12.0, 9.0, 11.0, 13.0, 10.5]
    d = [1.0, 2.0, -0.3, 1.5, 0.4, 1.2]  # paired t-test p = 0.0338
    b = list(np.add(a, d))
    ta, tb = runs({"m1": a, "m2": a}, "x"), runs({"m1": b, "m2": b}, "y")
    holm = compare(ta, tb, ["m1", "m2"])
    assert holm["p_value"].tolist() == pytest.approx([0.0338] * 2, abs=1e-4)
    assert holm["p_adj"].tolist() == pytest.approx([2 * holm["p_value"].iloc[0]] * 2)
    assert (holm["diff"].abs() > holm["diff_ci"]).all()  # each interval excludes 0 ...
    assert not holm["significant"].any()  # ... but two tests at once: Holm says no
    bh = compare(ta, tb, ["m1", "m2"], adjust="bh")
    assert bh["p_adj"].tolist() == pytest.approx(bh["p_value"].tolist())
    assert bh["significant"].all()
    assert compare(ta, tb, ["m1", "m2"], adjust="none")["significant"].all()


def test_zero_differences_are_clean():
    a = list(BASE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cmp = compare(runs({"m": a}, "x"), runs({"m": a}, "y"), ["m"])
        assert wilcoxon_p(np.zeros(4)) == 1.0
    row = cmp.iloc[0]
    assert row["test"] == PAIRED and row["diff"] == 0 and row["diff_ci"] == 0
    assert row["p_value"] == 1 and row["p_adj"] == 1 and row["p_rank"] == 1
    assert row["effect"] == 0 and not row["significant"]


def test_a_shift_without_any_noise_is_certain():
    d = paired_difference(BASE, BASE + 2.0)
    assert (d.diff, d.diff_ci, d.p_value, d.effect) == (2.0, 0.0, 0.0, math.inf)


def test_one_pair_has_a_difference_but_no_test():
    cmp = compare(runs({"m": [5.0]}, "x"), runs({"m": [7.0]}, "y"), ["m"])
    row = cmp.iloc[0]
    assert row["test"] == PAIRED and row["n_pairs"] == 1 and row["diff"] == 2.0
    for col in ("diff_ci", "p_value", "p_adj", "p_rank", "effect"):
        assert math.isnan(row[col])
    assert not row["significant"]
    assert math.isnan(wilcoxon_p(np.array([1.0])))


def test_runs_pair_on_shared_seeds_only():
    a = runs({"m": [1.0, 2.0, 3.0, 4.0, 5.0]}, "x")
    b = runs({"m": [2.0, 3.1, 3.9, 5.0]}, "y", seeds=[0, 1, 2, 7])  # seed 7 has no partner
    row = compare(a, b, ["m"]).iloc[0]
    assert row["test"] == PAIRED and row["n_pairs"] == 3
    assert row["mean_a"] == 2.0 and row["mean_b"] == pytest.approx(3.0)
    other = runs({"m": [2.0, 3.1, 3.9, 5.0]}, "y", seeds=[10, 11, 12, 13])
    row = compare(a, other, ["m"]).iloc[0]
    assert row["test"] == WELCH and (row["n_a"], row["n_b"]) == (5, 4)


def test_failed_runs_drop_their_pair():
    a = runs({"m": [1.0, 2.0, 3.0, 4.0]}, "x")
    b = runs({"m": [1.5, 2.5, 3.5, math.nan]}, "y")
    b.loc[0, "status"] = "error"
    row = compare(a, b, ["m"]).iloc[0]
    assert row["test"] == PAIRED and row["n_pairs"] == 2 and row["diff"] == 0.5


def test_compare_command_pairs_two_sweeps_and_adjusts(tmp_path, capsys):
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": 100})
    grid = {"workload.arrival.rate": [2, 4]}
    a, b = tmp_path / "a", tmp_path / "b"
    orcasim.sweep(sc, grid, seeds=5, out=a, progress=False, n_jobs=1)
    orcasim.sweep(sc.override({"policy.max_batch": 16}), grid, seeds=5, out=b,
                  progress=False, n_jobs=1)
    csv = tmp_path / "cmp.csv"
    assert main(["compare", str(a), str(b), "--csv", str(csv)]) == 0
    text = capsys.readouterr().out
    cmp = pd.read_csv(csv)
    assert (cmp["test"] == PAIRED).all() and (cmp["n_pairs"] == 5).all()
    assert (cmp["p_adj"] >= cmp["p_value"]).all()
    tested = cmp["p_value"].notna()
    assert cmp.loc[tested, "p_adj"].tolist() == pytest.approx(
        adjust_pvalues(cmp.loc[tested, "p_value"].to_numpy(), "holm").tolist())
    assert (cmp["significant"] == (cmp["p_adj"] < 0.05)).all()
    assert cmp["significant"].any()
    assert ((cmp["p_value"] < 0.05) & ~cmp["significant"]).any()  # turned down by Holm
    header = text.splitlines()[4].split()
    assert header[:7] == ["workload.arrival.rate", "variant", "metric", "test", "n", "A", "B"]
    assert header[-6:] == ["change", "p", "p_holm", "effect", "p_rank", "sig"]
    assert f"{int(cmp['significant'].sum())} of {len(cmp)} differences significant" in text
    assert f"{len(cmp)} of {len(cmp)} rows paired" in text

    assert main(["compare", str(a), str(b), "--unpaired", "--adjust", "bh",
                 "--csv", str(csv)]) == 0
    welch = pd.read_csv(csv)
    assert (welch["test"] == WELCH).all() and "p_bh" in capsys.readouterr().out
    assert welch["significant"].sum() <= cmp["significant"].sum()


def test_compare_help_prints_plain_percent_signs(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "%%" not in capsys.readouterr().out
