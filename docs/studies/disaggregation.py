"""Disaggregated prefill/decode vs colocated serving on the same GPUs, two workloads.

Runs ``scenarios/disaggregation.yaml`` (4 H100s: colocated, 1:3, 2:2 and 3:1
prefill:decode) on its long-prompt workload and on a short-prompt one, each
over a range of arrival rates, then the disaggregated variants over link
bandwidths at one rate, 10 seeds each (resumable in ``--out``). Reports
goodput per GPU as DistServe defines it (finished requests per second meeting
both the TTFT and the TPOT SLO, divided by the GPUs) and the SLO attainment,
as mean ± 95% t-interval over seeds.

    python docs/studies/disaggregation.py [--out orcasim-out/disaggregation] [--jobs 2]
        [--plot docs/img/disaggregation.png] [--seeds N]
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

import orcasim
from orcasim.experiments.stats import t_interval

SCENARIO = "disaggregation"
VARIANTS = ("colocated", "1p3d", "2p2d", "3p1d")
#: workload -> (overrides of the scenario's workload, rates swept)
WORKLOADS = {
    "long prompts": ([], [8, 12, 16, 24]),
    "short prompts": (["workload.num_requests=300",
                       "workload.prompt_len={type: uniform, low: 128, high: 512}",
                       "workload.output_len={type: uniform, low: 128, high: 512}"],
                      [60, 120, 180, 240]),
}
#: link bandwidths (GB/s) swept at one rate of the long-prompt workload
LINK_RATE = 16
BANDWIDTHS = [0.5, 1.0, 2.0, 5.0, 12.5, 50.0]
METRICS = ("goodput_req_s_per_gpu", "slo_attainment")
COLORS = {v: f"C{k}" for k, v in enumerate(VARIANTS)}


def summarize(df: pd.DataFrame, keys: list[str]) -> list[dict]:
    """Mean and 95% t-interval of each metric over seeds, per ``keys`` group."""
    rows = []
    for k, g in df.groupby(keys):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True))
        row["seeds"] = g["seed"].nunique()
        for m in METRICS:
            vals = g[m].to_numpy(dtype=np.float64)
            row[m], row[m + "_lo"], row[m + "_hi"] = t_interval(vals)
        rows.append(row)
    return rows


def ci(r: dict, m: str, scale: float = 1.0, digits: int = 2) -> str:
    half = (r[m + "_hi"] - r[m + "_lo"]) / 2 * scale
    return f"{r[m] * scale:.{digits}f} ± {half:.{digits}f}"


def markdown(rate_rows: dict[str, list[dict]], link_rows: list[dict]) -> str:
    lines = []
    for wl, rows in rate_rows.items():
        rates = sorted({r["workload.arrival.rate"] for r in rows})
        lines += [f"{wl}: goodput per GPU (req/s), SLO attainment in brackets", "",
                  "| rate (req/s) | " + " | ".join(VARIANTS) + " |",
                  "|---:|" + "---:|" * len(VARIANTS)]
        for rate in rates:
            cells = []
            for v in VARIANTS:
                r = next(x for x in rows if x["variant"] == v
                         and x["workload.arrival.rate"] == rate)
                cells.append(f"{ci(r, 'goodput_req_s_per_gpu')} "
                             f"({100 * r['slo_attainment']:.0f}%)")
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"long prompts at {LINK_RATE} req/s: goodput per GPU (req/s) by link bandwidth",
              "", "| link (GB/s) | " + " | ".join(VARIANTS[1:]) + " |",
              "|---:|" + "---:|" * (len(VARIANTS) - 1)]
    for bw in BANDWIDTHS:
        cells = [ci(next(x for x in link_rows if x["variant"] == v
                         and x["cluster.link.bandwidth_gb_s"] == bw), "goodput_req_s_per_gpu")
                 for v in VARIANTS[1:]]
        lines.append(f"| {bw:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(out: Path, jobs: int | None,
        seeds: int | None = None) -> tuple[dict[str, list[dict]], list[dict]]:
    """Both workloads' rate sweeps and the link sweep; their summarized rows."""
    rate_rows = {}
    for k, (wl, (overrides, rates)) in enumerate(WORKLOADS.items()):
        sc = orcasim.load_scenario(SCENARIO, overrides=overrides or None)
        df = orcasim.sweep(sc, grid={"workload.arrival.rate": rates}, seeds=seeds,
                           out=out / f"rate{k}", n_jobs=jobs, progress=False)
        rate_rows[wl] = summarize(df, ["variant", "workload.arrival.rate"])
    raw = yaml.safe_load((resources.files("orcasim.scenarios") / f"{SCENARIO}.yaml").read_text())
    del raw["variants"]["colocated"]  # no link to vary
    sc = orcasim.Scenario(raw, f"{SCENARIO}.yaml")
    df = orcasim.sweep(sc, grid={"cluster.link.bandwidth_gb_s": BANDWIDTHS,
                                 "workload.arrival.rate": [LINK_RATE]},
                       seeds=seeds, out=out / "link", n_jobs=jobs, progress=False)
    link_rows = summarize(df, ["variant", "cluster.link.bandwidth_gb_s"])
    colo = next(r for r in rate_rows["long prompts"] if r["variant"] == "colocated"
                and r["workload.arrival.rate"] == LINK_RATE)
    for r in link_rows:
        r["colocated"] = colo["goodput_req_s_per_gpu"]
    return rate_rows, link_rows


def plot(rate_rows: dict[str, list[dict]], link_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (wl, rows) in zip(axes[:2], rate_rows.items(), strict=True):
        for v in VARIANTS:
            sel = sorted((r for r in rows if r["variant"] == v),
                         key=lambda r: r["workload.arrival.rate"])
            x = [r["workload.arrival.rate"] for r in sel]
            y = np.array([r["goodput_req_s_per_gpu"] for r in sel])
            lo = np.array([r["goodput_req_s_per_gpu_lo"] for r in sel])
            hi = np.array([r["goodput_req_s_per_gpu_hi"] for r in sel])
            ax.plot(x, y, marker="o", label=v, color=COLORS[v])
            ax.fill_between(x, lo, hi, alpha=0.2, color=COLORS[v])
        ax.set_title(wl)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("goodput per GPU (req/s)")
        ax.grid(True, alpha=0.3)
    ax = axes[2]
    for v in VARIANTS[1:]:
        sel = sorted((r for r in link_rows if r["variant"] == v),
                     key=lambda r: r["cluster.link.bandwidth_gb_s"])
        ax.plot([r["cluster.link.bandwidth_gb_s"] for r in sel],
                [r["goodput_req_s_per_gpu"] for r in sel], marker="o", label=v,
                color=COLORS[v])
    ax.axhline(link_rows[0]["colocated"], color="k", ls="--", lw=1, label="colocated")
    ax.set_xscale("log")
    ax.set_title(f"long prompts at {LINK_RATE} req/s")
    ax.set_xlabel("link bandwidth (GB/s)")
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    ax.legend(fontsize="small")
    fig.suptitle("4 × Llama-3.1-8B / H100, vllm-v1, SLO TTFT 1 s and TPOT 15 ms: "
                 "mean ± 95% CI over 10 seeds", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("orcasim-out") / SCENARIO)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--seeds", type=int, default=None, help="default: the scenario's 10")
    args = p.parse_args(argv)
    rate_rows, link_rows = run(args.out, args.jobs, args.seeds)
    print(markdown(rate_rows, link_rows))
    if args.plot is not None:
        plot(rate_rows, link_rows, args.plot)
        print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
