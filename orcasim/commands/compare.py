"""``orcasim compare DIR_A DIR_B``: the difference of each metric between two sweeps.

Exit status 2 when a directory is not a sweep, the sweeps do not match, a
metric is missing or an option is out of range.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "compare", help="compare two sweeps: differences, confidence intervals, significance",
        description="Match the two sweeps' grid points and print, for each metric, A and B "
        "(mean ± 95%% CI), the difference B - A (Welch 95%% CI) and the Mann-Whitney U "
        "p-value on the per-run values.")
    c.add_argument("a", type=Path, metavar="DIR_A", help="the baseline sweep directory")
    c.add_argument("b", type=Path, metavar="DIR_B", help="the sweep compared with it")
    c.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric to compare (repeatable; default: a standard set)")
    c.add_argument("--alpha", type=float, default=0.05, help="significance level (0.05)")
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
    cmp = compare(args.a, args.b, args.metrics, alpha=args.alpha)
    print(f"A = {args.a}, B = {args.b}; mean ± 95% CI over seeds, "
          f"p: two-sided Mann-Whitney U on per-run values")
    print(format_comparison(cmp, args.alpha))
    sig = int(cmp["significant"].sum())
    print(f"\n{sig} of {len(cmp)} differences significant at alpha = {args.alpha:g}")
    if csv is not None:
        make_parent(csv)
        cmp.to_csv(csv, index=False)
    return 0
