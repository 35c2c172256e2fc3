"""``orcasim sweep``: run a grid of settings times several seeds; write one table of runs."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    s.add_argument("--seeds", type=int, default=None,
                   help="replications per point (default: sweep.seeds, else 1)")
    s.add_argument("--seed", type=int, default=None,
                   help="base seed the runs' seeds derive from (default: the scenario's)")
    s.add_argument("--out", type=Path, default=None,
                   help="output directory (default: orcasim-out/<scenario name>-sweep)")
    s.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field for every run")
    s.add_argument("--jobs", "-j", type=int, default=None,
                   help="parallel workers (default: every local core; -1 likewise)")
    s.add_argument("--backend", choices=("loky", "dask", "ray"), default="loky",
                   help="loky: local processes (default); dask/ray: an existing cluster")
    s.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="the dask scheduler's address (with --backend dask)")
    s.add_argument("--address", default=None, metavar="HOST:6379",
                   help="the Ray cluster's address (with --backend ray; default: auto)")
    s.add_argument("--keep-requests", type=int, default=None, metavar="N",
                   help="replications per point whose per-request rows are kept "
                   "for reports (default: sweep.keep_requests, else 1)")
    s.add_argument("--retry-failed", action="store_true",
                   help="run failed runs again instead of keeping their recorded error")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric to print with its confidence interval (repeatable)")
    s.set_defaults(handler=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from orcasim.errors import OrcasimError
    from orcasim.experiments.grid import parse_grid_arg
    from orcasim.experiments.runner import sweep
    from orcasim.experiments.stats import aggregate, pm_table
    from orcasim.scenario import load_scenario

    if args.jobs is not None and args.jobs == 0:
        raise OrcasimError("--jobs must be a positive number (or -1 for every core)")
    if args.backend != "dask" and args.scheduler:
        raise OrcasimError("--scheduler goes with --backend dask")
    if args.backend != "ray" and args.address:
        raise OrcasimError("--address goes with --backend ray")
    grid = dict(parse_grid_arg(g) for g in args.grid)
    sc = load_scenario(args.scenario, args.overrides or None)
    out = args.out if args.out is not None else Path("orcasim-out") / f"{sc.name}-sweep"
    df = sweep(sc, grid, args.seeds, out, seed=args.seed, n_jobs=args.jobs,
               backend=args.backend, scheduler=args.scheduler, address=args.address,
               keep_requests=args.keep_requests, retry_failed=args.retry_failed,
               progress=not args.no_progress)
    info = df.attrs["sweep"]
    params = list(df.columns[4 : list(df.columns).index("status")])
    metrics = args.metrics or [m for m in SUMMARY_METRICS if m in df.columns]
    missing = [m for m in metrics if m not in df.columns]
    if missing:
        raise OrcasimError(f"no metric {missing[0]!r} in the results")
    table = pm_table(aggregate(df, params, metrics), params, metrics)
    print(f"sweep {sc.name}: {info['total']} runs: {info['computed']} run now, "
          f"{info['reused']} already done, {int((df['status'] != 'ok').sum())} failed or "
          f"invalid; {info['wall_s']:.1f} s")
    if not table.empty:
        print("mean ± 95% CI over seeds:")
        print(table.to_string(index=False))
    _print_problems(df)
    print(f"\nwrote {out}/results.parquet and results.csv")
    return 0 if (df["status"] == "ok").all() else 1


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
