"""Priority classes under KV memory pressure: what each setting buys interactive traffic.

Runs every variant of the ``priority_kv_pressure`` scenario (FCFS, strict
priority without and with preemption by recompute or by swap, weighted class
shares; each alone and with ``kv_fit`` admission) on the same requests for
each seed, and reports per setting the mean over seeds with a 95%
t-interval of: the interactive class's p99 TTFT and throughput, the batch
class's throughput and p99 TTFT, preemptions, recomputed tokens (work lost
to recompute preemptions) and requests turned away for memory. Writes
``table.md``, ``runs.csv`` and ``tradeoff.png`` (batch throughput against
interactive p99 TTFT, one point per setting, with both intervals) to ``--out``.

    python -m orcasim.studies.priority_pressure [--seeds 10] [--out priority-pressure]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orcasim.experiments.stats import t_interval
from orcasim.scenario import Scenario, load_scenario
from orcasim.simulation import simulate

#: column -> summary key
METRICS = {
    "interactive_ttft_p99": "class.interactive.ttft_p99",
    "interactive_tok_s": "class.interactive.throughput_tok_s",
    "batch_tok_s": "class.batch.throughput_tok_s",
    "batch_ttft_p99": "class.batch.ttft_p99",
    "num_preemptions": "num_preemptions",
    "num_recomputed_tokens": "num_recomputed_tokens",
    "rejected_kv_full": "rejected_kv_full",
}
HEADERS = {
    "interactive_ttft_p99": "interactive p99 TTFT (s)",
    "interactive_tok_s": "interactive tok/s",
    "batch_tok_s": "batch tok/s",
    "batch_ttft_p99": "batch p99 TTFT (s)",
    "num_preemptions": "preemptions",
    "num_recomputed_tokens": "recomputed tokens",
    "rejected_kv_full": "rejected (kv_full)",
}


def runs(seeds: Iterable[int], scenario: Scenario | None = None,
         overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per (setting, seed); every setting of a seed runs on the same requests."""
    sc = scenario if scenario is not None else load_scenario("priority_kv_pressure")
    if overrides:
        sc = sc.override(overrides)
    rows = []
    for seed in seeds:
        for name, v in simulate(sc, seed=seed).items():
            row: dict[str, Any] = {"setting": name, "seed": seed}
            for col, key in METRICS.items():
                row[col] = float(v.summary.get(key, 0))
            rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting (in scenario order): mean and 95% CI half-width of every metric."""
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        sel = [r for r in rows if r["setting"] == setting]
        row: dict[str, Any] = {"setting": setting, "seeds": len(sel)}
        for col in METRICS:
            mean, low, high = t_interval([r[col] for r in sel])
            row[col], row[col + "_ci"] = mean, (high - low) / 2
        out.append(row)
    return out


def paired(rows: Sequence[dict[str, Any]], baseline: str = "fcfs") -> list[dict[str, Any]]:
    """Per setting: throughput minus the baseline's on the same seed (paired), mean and CI.

    Each seed's settings run on identical requests, so the per-seed
    differences remove the seed-to-seed variation of the workload.
    """
    base = {r["seed"]: r for r in rows if r["setting"] == baseline}
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        if setting == baseline:
            continue
        sel = [r for r in rows if r["setting"] == setting and r["seed"] in base]
        row: dict[str, Any] = {"setting": setting}
        for col in ("interactive_tok_s", "batch_tok_s", "total_tok_s"):
            if col == "total_tok_s":
                d = [total(r) - total(base[r["seed"]]) for r in sel]
            else:
                d = [r[col] - base[r["seed"]][col] for r in sel]
            mean, low, high = t_interval(d)
            row[col], row[col + "_ci"] = mean, (high - low) / 2
        out.append(row)
    return out


def total(row: dict[str, Any]) -> float:
    """Both classes' output tokens per second."""
    return float(row["interactive_tok_s"] + row["batch_tok_s"])


def paired_markdown(diffs: Sequence[dict[str, Any]], baseline: str = "fcfs") -> str:
    """The paired differences as Markdown (output tok/s minus the baseline's)."""
    lines = [f"| setting | interactive tok/s - {baseline} | batch tok/s - {baseline} "
             f"| total tok/s - {baseline} |", "|---|---:|---:|---:|"]
    for r in diffs:
        cells = [f"{r[c]:+.1f} ± {r[c + '_ci']:.1f}"
                 for c in ("interactive_tok_s", "batch_tok_s", "total_tok_s")]
        lines.append(f"| {r['setting']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    """The table as Markdown, ``mean ± half-width`` per cell."""
    cols = list(METRICS)
    lines = ["| setting | " + " | ".join(HEADERS[c] for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for r in summary:
        cells = []
        for c in cols:
            if r[c] == 0 and not r[c + "_ci"]:
                cells.append("0")
                continue
            digits = 2 if r[c] < 10 else (1 if r[c] < 1000 else 0)
            cells.append(f"{r[c]:,.{digits}f} ± {r[c + '_ci']:,.{digits}f}")
        lines.append(f"| {r['setting']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: Sequence[dict[str, Any]], path: str | Path, title: str) -> Path:
    """Batch throughput (x) against interactive p99 TTFT (y, log), with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for gated, marker, color, label in ((False, "o", "tab:blue", "no admission control"),
                                        (True, "s", "tab:orange", "with kv_fit")):
        sel = [r for r in summary if r["setting"].endswith("+kv_fit") == gated]
        ax.errorbar([r["batch_tok_s"] for r in sel], [r["interactive_ttft_p99"] for r in sel],
                    xerr=[r["batch_tok_s_ci"] for r in sel],
                    yerr=[r["interactive_ttft_p99_ci"] for r in sel],
                    fmt=marker, color=color, ecolor="tab:gray", capsize=3, label=label)
        for i, r in enumerate(sel):  # labels alternate above and below their point
            ax.annotate(r["setting"].removesuffix("+kv_fit"),
                        (r["batch_tok_s"], r["interactive_ttft_p99"]),
                        textcoords="offset points", xytext=(6, 5 if i % 2 else -12),
                        fontsize=8)
    ax.set_xlabel("batch class throughput (output tok/s)")
    ax.set_ylabel("interactive p99 TTFT (s)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--num-requests", type=int, default=None, help="override the request count")
    ap.add_argument("--out", type=Path, default=Path("priority-pressure"))
    args = ap.parse_args(argv)
    over = {"workload.num_requests": args.num_requests} if args.num_requests else None
    sc = load_scenario("priority_kv_pressure")
    rows = runs(range(args.seeds), sc, over)
    summary = table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    md = markdown(summary) + "\n\n" + paired_markdown(paired(rows))
    (args.out / "table.md").write_text(md + "\n")
    import pandas as pd

    pd.DataFrame(rows).to_csv(args.out / "runs.csv", index=False)
    n = args.num_requests or sc.variants[0].workload.params.num_requests
    title = (f"priority_kv_pressure: OPT-13B / A100-40GB, {n} requests at 2.5 req/s, "
             f"mean and 95% CI over {args.seeds} seeds")
    png = plot(summary, args.out / "tradeoff.png", title)
    print(md)
    print(f"\nwrote {args.out / 'table.md'}, {args.out / 'runs.csv'}, {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
