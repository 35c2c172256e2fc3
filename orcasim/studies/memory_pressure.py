"""The memory-pressure study: paged vs reservation KV allocators over a sweep of request rates.

Runs the ``memory_pressure`` scenario (every variant: ``paged``, ``oracle``,
``pow2``, ``max``) at each rate on the same requests and writes to ``--out``:

- ``sweep.csv``: one row per (rate, allocator) with the summary metrics and
  the normalised latency (mean over requests of end-to-end latency / output
  tokens, s/token, as in the vLLM paper);
- ``memory_table.csv`` and ``.md``: KV memory use per allocator at the
  table rate (default: the highest rate, where every allocator is
  memory-bound), time-averaged over the busy time;
- ``latency_vs_rate.png``: normalised latency vs request rate, one line per
  allocator; ``timeline.png``: KV usage and queue length over time at one rate.

It prints the table and, per allocator, the highest swept rate whose mean
normalised latency stays within ``--slo`` s/token.

    python -m orcasim.studies.memory_pressure [--rates 0.25 0.5 ...] [--num-requests 1000]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from orcasim.errors import OrcasimError, UsageError
from orcasim.metrics.results import Results
from orcasim.request import RequestState
from orcasim.scenario import Scenario, load_scenario
from orcasim.simulation import simulate

RATES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0)
TABLE = [
    ("kv_used_token_share", "real tokens, % of KV memory in use"),
    ("kv_token_share", "real tokens"),
    ("kv_reserved_share", "reserved (filled later)"),
    ("kv_internal_frag_share", "internal fragmentation"),
    ("kv_external_frag_share", "external fragmentation"),
    ("kv_free_share", "free"),
    ("kv_alloc_waste", "allocated but not holding tokens"),
]


def normalised_latency(cols: dict[str, Any]) -> float:
    """Mean over finished requests of E2E latency / output tokens (s/token)."""
    done = cols["state"] == int(RequestState.FINISHED)
    e2e = cols["finish"][done] - cols["arrival"][done]
    return float(np.mean(e2e / cols["num_output_tokens"][done])) if done.any() else math.nan


def sweep(sc: Scenario, rates: list[float], seed: int | None = None,
          keep: float | None = None) -> tuple[list[dict[str, Any]], Results | None]:
    """Run every variant at every rate: long-format rows, and the results at rate ``keep``."""
    rows = []
    kept = None
    for rate in rates:
        res = simulate(sc.override({"workload.arrival.rate": rate}), seed)
        for name, v in res.items():
            rows.append({"rate": rate, "allocator": name,
                         "norm_latency": normalised_latency(v.columns), **v.summary})
        if keep is not None and rate == keep:
            kept = res
    return rows, kept


def sustained_rates(rows: list[dict[str, Any]], slo: float) -> dict[str, float]:
    """Per allocator, the highest rate up to which mean normalised latency stays <= ``slo``."""
    out: dict[str, float] = {}
    for name in dict.fromkeys(r["allocator"] for r in rows):
        best = math.nan
        for r in sorted((r for r in rows if r["allocator"] == name), key=lambda r: r["rate"]):
            if not r["norm_latency"] <= slo:
                break
            best = r["rate"]
        out[name] = best
    return out


def memory_table(rows: list[dict[str, Any]], rate: float) -> list[dict[str, Any]]:
    """KV memory use (%) per allocator at ``rate``: one dict per allocator."""
    table = []
    for r in rows:
        if r["rate"] == rate:
            table.append({"allocator": r["allocator"],
                          **{key: 100 * r[key] for key, _ in TABLE},
                          "num_preemptions": r["num_preemptions"]})
    return table


def format_table(table: list[dict[str, Any]]) -> str:
    """The memory table as Markdown: rows are quantities, columns allocators."""
    names = [t["allocator"] for t in table]
    lines = ["| % of KV memory | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for key, label in TABLE:
        lines.append(f"| {label} | " + " | ".join(f"{t[key]:.1f}" for t in table) + " |")
    lines.append("| preemptions | " + " | ".join(str(int(t["num_preemptions"])) for t in table)
                 + " |")
    return "\n".join(lines)


def plot_latency(rows: list[dict[str, Any]], path: Path, ylim: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in dict.fromkeys(r["allocator"] for r in rows):
        pts = sorted((r["rate"], r["norm_latency"]) for r in rows if r["allocator"] == name)
        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalised latency (s/token)")
    if ylim is not None:
        ax.set_ylim(0, ylim)
    ax.grid(True, alpha=0.3)
    ax.legend(title="KV allocator")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(res: Results, rate: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(res)
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 5.4), sharex=True,
                             sharey="row", squeeze=False)
    for j, name in enumerate(names):
        v = res[name]
        cap = v.summary["kv_capacity_tokens"]
        kv = v.kv_usage
        t = (kv["t_start"] + kv["t_end"]) / 2
        ax = axes[0, j]
        ax.fill_between(t, 0, 100 * kv["allocated"] / cap, step="mid", alpha=0.35,
                        label="allocated")
        ax.plot(t, 100 * kv["tokens"] / cap, drawstyle="steps-mid", lw=0.8, label="real tokens")
        ax.set_title(name)
        ax.set_ylim(0, 100)
        s = v.step_series
        axes[1, j].plot((s["t_start"] + s["t_end"]) / 2, s["num_waiting"],
                        drawstyle="steps-mid", lw=0.8, color="tab:red")
        axes[1, j].set_xlabel("time (s)")
        for a in axes[:, j]:
            a.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("% of KV memory")
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[1, 0].set_ylabel("requests waiting")
    fig.suptitle(f"KV usage and queue length at {rate:g} req/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)


def run(args: argparse.Namespace) -> int:
    sc = load_scenario(args.scenario)
    if args.num_requests is not None:
        sc = sc.override({"workload.num_requests": args.num_requests})
    rates = sorted(set(args.rates))
    table_rate = args.table_rate if args.table_rate is not None else rates[-1]
    timeline_rate = args.timeline_rate if args.timeline_rate is not None else rates[len(rates) // 2]
    for r, what in ((table_rate, "--table-rate"), (timeline_rate, "--timeline-rate")):
        if r not in rates:
            raise UsageError(f"{what} {r:g} is not one of the swept rates")
    rows, kept = sweep(sc, rates, args.seed, keep=timeline_rate)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "sweep.csv")
    table = memory_table(rows, table_rate)
    write_csv(table, out / "memory_table.csv")
    md = format_table(table)
    (out / "memory_table.md").write_text(f"KV memory use at {table_rate:g} req/s "
                                         f"(time-averaged over busy time)\n\n{md}\n")
    sustained = sustained_rates(rows, args.slo)
    print(f"scenario {sc.name}: {sc.model.workload['num_requests']} requests per run, "
          f"rates {', '.join(f'{r:g}' for r in rates)} req/s\n")
    print(f"KV memory use at {table_rate:g} req/s (% of KV memory, time-averaged):\n")
    print(md)
    print(f"\nhighest rate with mean normalised latency <= {args.slo:g} s/token:")
    for name, r in sustained.items():
        print(f"  {name:<8} {r:g} req/s" if not math.isnan(r) else f"  {name:<8} none")
    if not args.no_plots:
        plot_latency(rows, out / "latency_vs_rate.png", args.ylim)
        assert kept is not None
        plot_timeline(kept, timeline_rate, out / "timeline.png")
    print(f"\nwrote {out}/: sweep.csv, memory_table.csv, memory_table.md"
          + ("" if args.no_plots else ", latency_vs_rate.png, timeline.png"))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orcasim.studies.memory_pressure",
                                description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="memory_pressure", help="scenario file or built-in")
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES), metavar="RATE")
    p.add_argument("--num-requests", type=int, default=None, help="requests per run")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--table-rate", type=float, default=None,
                   help="rate of the memory table (default: the highest)")
    p.add_argument("--timeline-rate", type=float, default=None,
                   help="rate of the timeline plot (default: the middle one)")
    p.add_argument("--slo", type=float, default=0.1, help="normalised latency bound, s/token")
    p.add_argument("--ylim", type=float, default=1.0, help="y limit of the latency plot")
    p.add_argument("--out", type=Path, default=Path("orcasim-out/memory_pressure"))
    p.add_argument("--no-plots", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except OrcasimError as err:
        print(f"memory_pressure: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
