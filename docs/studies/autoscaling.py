"""GPU-seconds against SLO attainment: always-on replicas vs a TTFT-target autoscaler.

Runs every variant of ``scenarios/autoscaling.yaml`` with ``--seeds`` seeds
and reports per variant, as mean ± 95% t-interval: GPU-seconds (replicas x
time they were running, cold starts included), SLO attainment (finished
requests within TTFT 1 s and TPOT 50 ms), TTFT p90, and scale-ups. The plot
puts each variant in the plane (GPU-seconds, SLO attainment) with both
intervals.

    python docs/studies/autoscaling.py [--seeds 10] [--plot docs/img/autoscaling.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orcasim
from orcasim.experiments.stats import t_interval

SCENARIO = "autoscaling"
METRICS = ("gpu_seconds", "slo_attainment", "ttft_p90", "num_scale_ups")


def run(seeds: int) -> dict[str, dict[str, list[float]]]:
    """Per variant: each metric's values over seeds."""
    out: dict[str, dict[str, list[float]]] = {}
    for seed in range(seeds):
        for name, v in orcasim.simulate(SCENARIO, seed=seed).items():
            for m in METRICS:
                out.setdefault(name, {}).setdefault(m, []).append(float(v.summary.get(m, 0)))
    return out


def rows(metrics: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One row per variant: each metric's mean, low and high."""
    out = []
    for name, m in metrics.items():
        row: dict = {"variant": name}
        for k in METRICS:
            row[k], row[k + "_lo"], row[k + "_hi"] = t_interval(m[k])
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    def ci(r: dict, k: str, scale: float = 1.0, digits: int = 1) -> str:
        half = (r[k + "_hi"] - r[k + "_lo"]) / 2 * scale if r[k + "_hi"] == r[k + "_hi"] else 0
        return f"{r[k] * scale:.{digits}f} ± {half:.{digits}f}"

    lines = ["| variant | GPU-seconds | SLO attainment (%) | TTFT p90 (s) | scale-ups |",
             "|---|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['variant']} | {ci(r, 'gpu_seconds', 1, 0)} | "
                     f"{ci(r, 'slo_attainment', 100)} | {ci(r, 'ttft_p90', 1, 2)} | "
                     f"{ci(r, 'num_scale_ups')} |")
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in table:
        x, y = r["gpu_seconds"], 100 * r["slo_attainment"]
        xerr = (r["gpu_seconds_hi"] - r["gpu_seconds_lo"]) / 2
        yerr = 100 * (r["slo_attainment_hi"] - r["slo_attainment_lo"]) / 2
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=r["variant"])
    ax.set_xlabel("GPU-seconds (replicas x running time)")
    ax.set_ylabel("SLO attainment (%): TTFT <= 1 s, TPOT <= 50 ms")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("Compressed daily cycle on up to 8 H100s: mean ± 95% CI, 10 seeds",
                 fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    table = rows(run(args.seeds))
    print(markdown(table))
    if args.plot is not None:
        plot(table, args.plot)
        print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
