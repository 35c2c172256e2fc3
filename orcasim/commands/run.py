"""``orcasim run``: run a scenario's variants, print a comparison, write results and plots."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orcasim.commands.common import check_output_dir, seed_arg
from orcasim.errors import UsageError
from orcasim.progress import Progress

if TYPE_CHECKING:
    from orcasim.metrics.plot_process import PlotProcess
    from orcasim.metrics.results import Results

TABLE_METRICS = [
    "num_requests",
    "num_finished",
    "num_rejected",
    "num_aborted",
    "throughput_tok_s",
    "requests_per_s",
    "goodput_req_s",
    "queue_delay_p50",
    "queue_delay_p99",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "itl_p50",
    "itl_p99",
    "e2e_p50",
    "e2e_p99",
    # with the front end: the client's view
    "client_ttft_p50",
    "client_ttft_p99",
    "client_tpot_p50",
    "client_e2e_p50",
    "client_e2e_p99",
    "makespan_s",
    "num_steps",
    "mean_batch_size",
    "slot_utilisation",
    # with a memory section
    "kv_used_token_share",
    "kv_alloc_waste",
    "kv_peak_usage",
    "num_preemptions",
    "num_recomputed_tokens",
    "swapped_bytes",
    # policies with a prefix cache
    "prefix_cache_hit_rate",
    # clusters
    "num_replicas",
    "gpu_seconds",
    "gpu_busy_seconds",
    "load_imbalance",
]

CLASS_METRICS = ["num_finished", "num_rejected", "num_aborted", "throughput_tok_s",
                 "queue_delay_p99", "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p99",
                 "client_ttft_p50", "client_ttft_p99", "client_e2e_p99"]
TENANT_METRICS = ["num_requests", "num_finished", "service_tokens", "ttft_p99"]
REPLICA_METRICS = ["routed_share", "num_finished", "ttft_p50", "ttft_p99", "busy_fraction",
                   "kv_peak_usage", "prefix_cache_hit_rate"]


def group_tables(res) -> list[tuple[str, list[str]]]:
    """The per-class and per-tenant summary keys present in ``res``, for extra tables."""
    out = []
    for kind, wanted in (("class", CLASS_METRICS), ("tenant", TENANT_METRICS),
                         ("replica", REPLICA_METRICS)):
        names = list(dict.fromkeys(
            k[len(kind) + 1:].rpartition(".")[0] for v in res.values() for k in v.summary
            if k.startswith(kind + ".")))
        present = {k for v in res.values() for k in v.summary}
        keys = [k for n in names for m in wanted if (k := f"{kind}.{n}.{m}") in present]
        if kind == "tenant" and names:
            keys.append("jain_index")
        if keys:
            out.append((kind, keys))
    return out


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run a scenario's variants and compare them")
    r.add_argument("scenario", nargs="?", default=None,
                   help="scenario YAML file or built-in name (default: seed_orca)")
    r.add_argument("--out", type=Path, default=None,
                   help="output directory, created with its parents if missing "
                   "(default: orcasim-out/<scenario name>)")
    r.add_argument("--seed", type=seed_arg, default=None,
                   help="override the scenario's seed (an integer >= 0)")
    r.add_argument("--steps", action="store_true",
                   help="print the per-step schedule and write steps.csv")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field, e.g. --set policy.max_batch=16 (repeatable)")
    r.add_argument("--variant", dest="variants", action="append", default=None, metavar="NAME",
                   help="run only this variant (repeatable)")
    r.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    r.add_argument("--csv", action="store_true",
                   help="also write the per-request rows as requests.csv (requests.parquet "
                   "is always written)")
    add_metric_options(r)
    r.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check everything, simulate the chosen variants, print the tables and write the files."""
    from orcasim.metrics.plot_process import PlotProcess

    # the plots' child process imports matplotlib while this one simulates
    with PlotProcess("orcasim.metrics.plots", preload=PRELOAD,
                     child=False if args.no_plots else None) as plotter:
        return _run(args, plotter)


#: what the plots' child imports besides matplotlib: what unpickling the results and drawing
#: the Gantt chart (a DataFrame) need
PRELOAD = ("orcasim.metrics.results", "orcasim.simulation", "pandas")


def _run(args: argparse.Namespace, plotter: PlotProcess) -> int:
    """:func:`run`, with the process that draws the plots."""
    from orcasim.commands.preflight import check_scenario
    from orcasim.metrics.lifecycle import write_workload_reports
    from orcasim.scenario import load_scenario
    from orcasim.simulation import simulate

    sc = load_scenario(args.scenario, args.overrides or None)
    for name in args.variants or ():
        if name not in sc.variant_names:
            raise UsageError(f"--variant {name}: no variant {name!r} in {sc.source} "
                             f"(have: {', '.join(sc.variant_names)})")
    out = check_output_dir(args.out if args.out is not None else Path("orcasim-out") / sc.name)
    seed = sc.seed if args.seed is None else args.seed
    drawn = check_scenario(sc, seed, args.variants)
    chosen = [n for n in sc.variant_names if not args.variants or n in args.variants]
    print(f"scenario {sc.name} ({sc.source}), seed {seed}, variants: {', '.join(chosen)}")
    with Progress(sys.stdout) as progress:
        res = simulate(sc, seed, variants=args.variants, trace_steps=args.steps, workloads=drawn,
                       on_model=progress.watch)
    apply_percentiles(res, args)
    _print_results(res, args.steps)
    written = res.write(out, plots=not args.no_plots, requests_csv=args.csv, plotter=plotter)
    written += write_metric_vocabularies(res, args, out)
    written += write_workload_reports(res, out)
    print(f"\nwrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
    return 0


def _print_results(res: Results, steps: bool) -> None:
    """The per-step schedules (with ``--steps``), the comparison table and the group tables."""
    if steps:
        for name, v in res.items():
            s = v.summary
            used = int(s["seq_steps"])
            line = f"\n{name}: {int(s['num_steps'])} steps"
            if "slot_utilisation" in s:
                slots = round(used / s["slot_utilisation"]) if used else 0
                line += f", slot utilisation {used}/{slots}"
            print(line)
            print(v.format_steps())
        print()
    metrics = [m for m in TABLE_METRICS if any(m in v.summary for v in res.values())]
    metrics += sorted({k for v in res.values() for k in v.summary
                       if k.startswith(("rejected_", "aborted_"))})
    print(res.table(metrics))
    for kind, keys in group_tables(res):
        print(f"\nper {kind}:")
        print(res.table(keys))


# --- metric options: --percentiles and --metrics -------------------------------------------

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
VOCABULARIES = ("vllm",)


def percentile_list(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated percentiles in [0, 100], e.g. ``50,90,99.9``."""
    out = []
    for part in text.split(","):
        try:
            q = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated percentiles such as 50,90,99.9, got {text!r}"
            ) from None
        if not (math.isfinite(q) and 0 <= q <= 100):
            raise argparse.ArgumentTypeError(f"a percentile must be in [0, 100], got {part!r}")
        out.append(q)
    return tuple(dict.fromkeys(out))


def add_metric_options(r: argparse.ArgumentParser) -> None:
    """``--percentiles`` and ``--metrics``: extra summary percentiles and other vocabularies."""
    r.add_argument("--percentiles", type=percentile_list, default=None, metavar="Q,Q,...",
                   help="add <metric>_p<q> summary keys for these percentiles, e.g. "
                   "50,90,95,99,99.9 (p50, p90 and p99 are always there; 99.9 -> p99_9); "
                   "also the percentiles of --metrics vllm (default 50,90,99)")
    r.add_argument("--metrics", dest="vocabularies", action="append", default=[],
                   choices=VOCABULARIES, metavar="{" + ",".join(VOCABULARIES) + "}",
                   help="also write the summary in another tool's vocabulary: vllm writes "
                   "summary_vllm.json with vllm bench serve's keys and units (repeatable)")


def apply_percentiles(res: Results, args: argparse.Namespace) -> None:
    """Add the ``--percentiles`` keys to every variant's summary (before anything is written)."""
    if args.percentiles:
        res.add_percentiles(args.percentiles)


def write_metric_vocabularies(res: Results, args: argparse.Namespace, out: Path) -> list[Path]:
    """Write the ``--metrics`` files (``summary_vllm.json``) into ``out``; return their paths."""
    qs: Sequence[float] = args.percentiles or DEFAULT_PERCENTILES
    written = []
    if "vllm" in args.vocabularies:
        written.append(res.write_vllm_bench(out, qs))
    return written
