"""``orcasim sweep``: run a grid of settings times several seeds; write one table of runs.

Exit status: 0 when every run succeeded, 1 when some failed (a line on
stderr says how many), 2 for a usage or input error, found before ``--out``
is created or any run starts: bad arguments, a grid value that does not
validate or is given twice, an ``--out`` that cannot be a directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from orcasim.commands.common import jobs_arg, non_negative_int, positive_int, seed_arg

if TYPE_CHECKING:
    import pandas as pd

#: metrics printed (mean ± 95% CI) after a sweep, when the runs have them
SUMMARY_METRICS = [
    "throughput_tok_s",
    "requests_per_s",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "e2e_p99",
    "num_rejected",
]


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "sweep", help="run a grid of settings x seeds, in parallel, resumable",
        description="Run every combination of --grid values (and the scenario's `sweep:` "
        "section) with --seeds seeds each. Each finished run is saved under OUT/runs/ at "
        "once; running the same command again skips what is done.")
    s.add_argument("scenario", nargs="?", default=None,
                   help="scenario YAML file or built-in name (default: seed_orca)")
    s.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="a dotted scenario field and its values, or variant=NAME,NAME "
                   "(repeatable; all combinations run)")
    s.add_argument("--seeds", type=positive_int, default=None,
                   help="replications per point (default: sweep.seeds, else 1)")
    s.add_argument("--seed", type=seed_arg, default=None,
                   help="base seed the runs' seeds derive from, >= 0 (default: the scenario's)")
    s.add_argument("--out", type=Path, default=None,
                   help="output directory, created with its parents if missing "
                   "(default: orcasim-out/<scenario name>-sweep)")
    s.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field for every run")
    s.add_argument("--jobs", "-j", type=jobs_arg, default=None,
                   help="parallel workers (default: every local core; -1 likewise)")
    s.add_argument("--backend", choices=("loky", "dask", "ray"), default="loky",
                   help="loky: local processes (default); dask/ray: an existing cluster")
    s.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="the dask scheduler's address (with --backend dask)")
    s.add_argument("--address", default=None, metavar="HOST:6379",
                   help="the Ray cluster's address (with --backend ray; default: auto)")
    s.add_argument("--keep-requests", type=non_negative_int, default=None, metavar="N",
                   help="replications per point whose per-request rows are kept "
                   "for reports (default: sweep.keep_requests, else 1)")
    s.add_argument("--retry-failed", action="store_true",
                   help="run failed runs again instead of keeping their recorded error")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric to print with its confidence interval (repeatable)")
    s.set_defaults(handler=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    """Check the arguments, run the sweep, print the table and what failed."""
    import warnings

    from orcasim.commands.common import check_output_dir
    from orcasim.errors import FailedRunsWarning, UsageError
    from orcasim.experiments.grid import parse_grid_arg
    from orcasim.experiments.runner import sweep
    from orcasim.scenario import load_scenario

    if args.backend != "dask" and args.scheduler:
        raise UsageError("--scheduler goes with --backend dask")
    if args.backend != "ray" and args.address:
        raise UsageError("--address goes with --backend ray")
    grid = _grid([parse_grid_arg(g) for g in args.grid])
    sc = load_scenario(args.scenario, args.overrides or None)
    out = check_output_dir(args.out if args.out is not None
                           else Path("orcasim-out") / f"{sc.name}-sweep")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FailedRunsWarning)  # said below, as one line
        df = sweep(sc, grid, args.seeds, out, seed=args.seed, n_jobs=args.jobs,
                   backend=args.backend, scheduler=args.scheduler, address=args.address,
                   keep_requests=args.keep_requests, retry_failed=args.retry_failed,
                   progress=not args.no_progress)
    _print_summary(df, sc.name, args.metrics)
    print(f"\nwrote {out}/results.parquet and results.csv")
    return _failed_status(df)


def _grid(pairs: list[tuple[str, list]]) -> dict[str, list]:
    """The ``--grid`` options as one grid; a key given twice is an error."""
    from orcasim.errors import UsageError

    grid: dict[str, list] = {}
    for key, values in pairs:
        if key in grid:
            raise UsageError(f"--grid {key}: given twice (list all its values in one --grid)")
        grid[key] = values
    return grid


def _print_summary(df: pd.DataFrame, name: str, wanted: list[str] | None) -> None:
    """The run counts, the mean ± CI table and the failed runs."""
    from orcasim.errors import UsageError
    from orcasim.experiments.stats import aggregate, pm_table

    info = df.attrs["sweep"]
    params = list(df.columns[4 : list(df.columns).index("status")])
    metrics = wanted or [m for m in SUMMARY_METRICS if m in df.columns]
    missing = [m for m in metrics if m not in df.columns]
    if missing:
        raise UsageError(f"--metric {missing[0]}: no such metric in the results")
    table = pm_table(aggregate(df, params, metrics), params, metrics)
    print(f"sweep {name}: {info['total']} runs: {info['computed']} run now, "
          f"{info['reused']} already done, {int((df['status'] != 'ok').sum())} failed or "
          f"invalid; {info['wall_s']:.1f} s")
    if not table.empty:
        print("mean ± 95% CI over seeds:")
        print(table.to_string(index=False))
    _print_problems(df)


def _failed_status(df: pd.DataFrame) -> int:
    """0 when every run succeeded; else 1, with one line on stderr."""
    import sys

    bad = df[df["status"] != "ok"]
    if bad.empty:
        return 0
    print(f"orcasim: error: {len(bad)} of {len(df)} runs failed (see \"failed runs\" above)",
          file=sys.stderr)
    return 1


def _print_problems(df) -> None:  # type: ignore[no-untyped-def]
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        print("\nfailed runs:")
        for err, g in bad.groupby("error", sort=False):
            print(f"  {len(g)} x {err}")
    warn = df[(df["status"] == "ok") & (df["check_warnings"] != "")]
    if not warn.empty:
        print(f"\nwarning: {len(warn)} run(s) failed a sanity check, e.g. "
              f"run {warn['run_id'].iloc[0]}: {warn['check_warnings'].iloc[0]}")
