"""``orcasim compare DIR_A DIR_B``: the difference of each metric between two sweeps.

Exit status 2 when a directory is not a sweep, the sweeps do not match, a
metric is missing or an option is out of range.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

ADJUST_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no"}


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "compare", help="compare two sweeps: differences, confidence intervals, significance",
        description="Match the two sweeps' grid points and print, for each metric, A and B "
        "(mean ± CI), the difference B - A with its CI, the t-test's p-value, that p-value "
        "adjusted over all rows, an effect size and a rank test. Runs of A and B with the same "
        "seed (common random numbers) are compared pair by pair (paired t-test, Wilcoxon "
        "signed-rank); runs that do not pair up as independent samples (Welch's t-test, "
        "Mann-Whitney U). Intervals are at level 1 - alpha; a row is significant when its "
        "adjusted p-value is below alpha.")
    c.add_argument("a", type=Path, metavar="DIR_A", help="the baseline sweep directory")
    c.add_argument("b", type=Path, metavar="DIR_B", help="the sweep compared with it")
    c.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric to compare (repeatable; default: a standard set)")
    c.add_argument("--alpha", type=float, default=0.05,
                   help="significance level; intervals are at 1 - alpha (default: 0.05)")
    c.add_argument("--adjust", choices=("holm", "bh", "none"), default="holm",
                   help="multiple-testing adjustment of the p-values over all rows: holm "
                   "(family-wise error rate), bh (Benjamini-Hochberg false discovery rate) or "
                   "none (default: holm)")
    c.add_argument("--unpaired", action="store_true",
                   help="treat the runs as independent even where they share seeds (Welch)")
    c.add_argument("--csv", type=Path, default=None,
                   help="also write the comparison here (missing parent directories are created)")
    c.set_defaults(handler=compare_cmd)


def compare_cmd(args: argparse.Namespace) -> int:
    """Check the options, compare the two sweeps, print (and with ``--csv`` write) the result."""
    from orcasim.commands.common import check_output_file, make_parent
    from orcasim.errors import UsageError
    from orcasim.experiments.comparison import compare, format_comparison

    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (got {args.alpha:g})")
    csv = check_output_file(args.csv, "--csv") if args.csv is not None else None
    cmp = compare(args.a, args.b, args.metrics, alpha=args.alpha, adjust=args.adjust,
                  paired=not args.unpaired)
    print(legend(args.a, args.b, cmp, args.alpha, args.adjust))
    print(format_comparison(cmp, args.alpha, args.adjust))
    print("\n" + summary(cmp, args.alpha, args.adjust))
    if csv is not None:
        make_parent(csv)
        cmp.to_csv(csv, index=False)
    return 0


def legend(a: Path, b: Path, cmp: pd.DataFrame, alpha: float, adjust: str) -> str:
    """What the table's columns mean (for the tests it uses), printed above it."""
    level = f"{100 * (1 - alpha):g}%"
    tests = set(cmp["test"])
    lines = [f"A = {a}, B = {b}; A, B: mean ± {level} CI over seeds"]
    if "paired t" in tests:
        lines += [f"paired t: runs paired on their seed, n pairs; B - A: mean paired difference "
                  f"± {level} t-interval;", "          p: paired t-test; effect: Cohen's d_z; "
                  "p_rank: Wilcoxon signed-rank"]
    if "Welch" in tests:
        lines += [f"Welch:    independent runs, n = n_A/n_B; B - A ± {level} Welch interval;",
                  "          p: Welch t-test; effect: Cohen's d; p_rank: Mann-Whitney U"]
    adjusted = (f"p adjusted by {ADJUST_NAMES[adjust]} over the {len(cmp)} rows"
                if adjust != "none" else "p, not adjusted")
    lines.append(f"sig: p_{adjust} ({adjusted}) < {alpha:g}")
    return "\n".join(lines)


def summary(cmp: pd.DataFrame, alpha: float, adjust: str) -> str:
    """How many rows are paired and significant, and how many the adjustment turned down."""
    sig = int(cmp["significant"].sum())
    paired = int((cmp["test"] == "paired t").sum())
    raw = int((cmp["p_value"] < alpha).sum())
    text = (f"{sig} of {len(cmp)} differences significant at alpha = {alpha:g} "
            f"({ADJUST_NAMES[adjust]} adjustment); {paired} of {len(cmp)} rows paired")
    if raw > sig:
        more = raw - sig
        text += (f"; {more} more {'row has' if more == 1 else 'rows have'} p < {alpha:g} "
                 "before the adjustment")
    return text
