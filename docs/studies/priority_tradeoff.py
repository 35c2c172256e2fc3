"""What does interactive latency cost batch traffic? The priority-classes trade-off.

Runs every variant of ``scenarios/priority_classes.yaml`` (FCFS, weighted
class shares 1, 2, 4, 8, strict priority without and with preemption) with
several seeds, and reports per setting the interactive class's p99 TTFT and
the batch class's throughput, each as a mean over seeds with a 95%
t-interval (scipy). The plot puts one point per setting, with both
intervals, in the plane (batch throughput, interactive p99 TTFT).

    python docs/studies/priority_tradeoff.py [--seeds 10] [--plot docs/img/priority_tradeoff.png]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

import orcasim

METRICS = {
    "interactive_ttft_p99": "class.interactive.ttft_p99",
    "interactive_tok_s": "class.interactive.throughput_tok_s",
    "batch_tok_s": "class.batch.throughput_tok_s",
    "batch_ttft_p99": "class.batch.ttft_p99",
    "batch_finished": "class.batch.num_finished",
    "num_preemptions": None,
}


def runs(seeds: Iterable[int], scenario: str = "priority_classes",
         overrides: dict | None = None, variants: Sequence[str] | None = None) -> list[dict]:
    """One row per (setting, seed) with the metrics above."""
    sc = orcasim.load_scenario(scenario)
    if overrides:
        sc = sc.override(overrides)
    rows = []
    for seed in seeds:
        res = orcasim.simulate(sc, seed=seed, variants=variants)
        for name, v in res.items():
            row = {"setting": name, "seed": seed}
            for col, key in METRICS.items():
                row[col] = (float(v.columns["num_preemptions"].sum()) if key is None
                            else float(v.summary[key]))
            rows.append(row)
    return rows


def t_interval(x: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the ``level`` t confidence interval of the mean of ``x``."""
    from scipy import stats

    a = np.asarray(x, dtype=np.float64)
    if a.size < 2:
        return float(a.mean()), math.nan
    half = stats.t.ppf(0.5 + level / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size)
    return float(a.mean()), float(half)


def table(rows: list[dict]) -> list[dict]:
    """Per setting (in scenario order): mean and CI half-width of every metric."""
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        sel = [r for r in rows if r["setting"] == setting]
        row: dict = {"setting": setting, "seeds": len(sel)}
        for col in METRICS:
            row[col], row[col + "_ci"] = t_interval([r[col] for r in sel])
        out.append(row)
    return out


def plot(summary: list[dict], path: str | Path) -> Path:
    """The trade-off: batch throughput (x) against interactive p99 TTFT (y), with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["batch_tok_s"] for r in summary]
    y = [r["interactive_ttft_p99"] for r in summary]
    ax.errorbar(x, y, xerr=[r["batch_tok_s_ci"] for r in summary],
                yerr=[r["interactive_ttft_p99_ci"] for r in summary],
                fmt="o-", capsize=3, color="tab:blue", ecolor="tab:gray")
    for i, r in enumerate(summary):  # labels alternate above and below the line
        ax.annotate(r["setting"], (r["batch_tok_s"], r["interactive_ttft_p99"]),
                    textcoords="offset points", xytext=(6, 5 if i % 2 else -12), fontsize=8)
    ax.set_xlabel("batch class throughput (output tok/s)")
    ax.set_ylabel("interactive p99 TTFT (s)")
    ax.set_yscale("log")
    ax.set_title(f"priority_classes: mean and 95% t-interval over {summary[0]['seeds']} seeds")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown(summary: list[dict]) -> str:
    lines = ["| setting | interactive p99 TTFT (s) | interactive tok/s | batch tok/s "
             "| batch p99 TTFT (s) | preemptions |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in summary:
        lines.append(
            f"| {r['setting']} | {r['interactive_ttft_p99']:.1f} ± "
            f"{r['interactive_ttft_p99_ci']:.1f} | {r['interactive_tok_s']:.1f} ± "
            f"{r['interactive_tok_s_ci']:.1f} | {r['batch_tok_s']:.1f} ± "
            f"{r['batch_tok_s_ci']:.1f} | {r['batch_ttft_p99']:.1f} ± "
            f"{r['batch_ttft_p99_ci']:.1f} | {r['num_preemptions']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    ap.add_argument("--plot", type=Path, default=Path("docs/img/priority_tradeoff.png"))
    args = ap.parse_args()
    summary = table(runs(range(args.seeds)))
    print(markdown(summary))
    print(f"\nwrote {plot(summary, args.plot)}")


if __name__ == "__main__":
    main()
