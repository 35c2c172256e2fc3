"""Prefix-aware routing on Mooncake conversations: six routers, three router stalenesses.

Runs ``scenarios/cluster_prefix_routing.yaml``'s sweep (every variant x
``cluster.staleness`` in 0, 50 ms, 500 ms x 10 seeds; resumable in ``--out``)
and reports, per router and staleness, the cluster prefix-cache hit rate,
TTFT p50 and p99 and the load imbalance as mean ± 95% t-interval over seeds,
next to the single-cache ideal: the share of prompt tokens whose leading
blocks some earlier prompt already had (an unbounded cache that sees every
request).

    python docs/studies/cluster_prefix_routing.py [--out orcasim-out/cluster_prefix_routing-sweep]
        [--jobs 2] [--plot docs/img/cluster_prefix_routing.png]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import orcasim
from orcasim.experiments.stats import t_interval

SCENARIO = "cluster_prefix_routing"
METRICS = ("prefix_cache_hit_rate", "ttft_p50", "ttft_p99", "load_imbalance")
ROUTERS = ("round_robin", "least_outstanding", "power_of_two", "prefix_affinity",
           "prefix_affinity_bounded", "kv_overlap")


def ideal_hit_rate(hash_ids: Sequence[Sequence[int]], prompt_len: Sequence[int],
                   hash_block_size: int = 512) -> float:
    """Prompt tokens an unbounded cache serves: each prompt's leading hash blocks that an
    earlier prompt also began with (the last prompt token always recomputed)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for ids, n in zip(hash_ids, prompt_len, strict=True):
        prefixes = [tuple(ids[:j + 1]) for j in range(len(ids))]
        k = 0
        while k < len(prefixes) and prefixes[k] in seen:
            k += 1
        seen.update(prefixes)
        hit += min(k * hash_block_size, max(0, n - 1))
        total += n
    return hit / total if total else float("nan")


def scenario_ideal() -> float:
    """The ideal hit rate of the scenario's requests."""
    cfg = orcasim.load_scenario(SCENARIO).variants[0]
    arrays = orcasim.generate_workload(cfg)
    return ideal_hit_rate(arrays.attrs["hash_ids"], arrays.prompt_len.tolist())


def table(df) -> list[dict]:
    """One row per (router, staleness) of the sweep's table (one row per run): each metric's
    mean, low and high over seeds."""
    rows = []
    for (variant, staleness), g in df.groupby(["variant", "cluster.staleness"]):
        row = {"router": variant, "staleness": float(staleness), "seeds": g["seed"].nunique()}
        for m in METRICS:
            vals = g[m].to_numpy(dtype=np.float64)
            row[m], row[m + "_lo"], row[m + "_hi"] = t_interval(vals)
        rows.append(row)
    order = {r: k for k, r in enumerate(ROUTERS)}
    return sorted(rows, key=lambda r: (r["staleness"], order.get(r["router"], 99)))


def markdown(rows: list[dict], ideal: float) -> str:
    def ci(r: dict, m: str, scale: float = 1.0, digits: int = 1) -> str:
        half = (r[m + "_hi"] - r[m + "_lo"]) / 2 * scale
        return f"{r[m] * scale:.{digits}f} ± {half:.{digits}f}"

    lines = [f"single-cache ideal hit rate: {100 * ideal:.1f}%", "",
             "| staleness | router | hit rate (%) | TTFT p50 (s) | TTFT p99 (s) | imbalance |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['staleness'] * 1000:g} ms | {r['router']} | "
                     f"{ci(r, 'prefix_cache_hit_rate', 100)} | {ci(r, 'ttft_p50', 1, 2)} | "
                     f"{ci(r, 'ttft_p99', 1, 2)} | {ci(r, 'load_imbalance', 1, 2)} |")
    return "\n".join(lines)


def plot(rows: list[dict], ideal: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stale = sorted({r["staleness"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = (("prefix_cache_hit_rate", "cluster prefix-cache hit rate (%)", 100),
              ("ttft_p99", "TTFT p99 (s)", 1), ("load_imbalance", "load imbalance (max/mean)", 1))
    width = 0.8 / len(ROUTERS)
    for ax, (m, label, scale) in zip(axes, panels, strict=True):
        for k, router in enumerate(ROUTERS):
            sel = [next(r for r in rows if r["router"] == router and r["staleness"] == s)
                   for s in stale]
            x = np.arange(len(stale)) + (k - (len(ROUTERS) - 1) / 2) * width
            y = np.array([r[m] for r in sel]) * scale
            err = np.array([(r[m + "_hi"] - r[m + "_lo"]) / 2 for r in sel]) * scale
            ax.bar(x, y, width, yerr=err, capsize=2, label=router)
        if m == "prefix_cache_hit_rate":
            ax.axhline(100 * ideal, color="k", ls="--", lw=1, label="single-cache ideal")
        ax.set_xticks(np.arange(len(stale)), [f"{s * 1000:g} ms" for s in stale])
        ax.set_xlabel("router staleness")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small")
    fig.suptitle("Mooncake conversations (400 requests) on 8 × Llama-3.1-8B / H100, vllm-v1: "
                 "mean ± 95% CI over 10 seeds", fontsize="medium")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("orcasim-out") / f"{SCENARIO}-sweep")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    df = orcasim.sweep(SCENARIO, out=args.out, n_jobs=args.jobs, progress=False)
    rows = table(df)
    ideal = scenario_ideal()
    print(markdown(rows, ideal))
    if args.plot is not None:
        plot(rows, ideal, args.plot)
        print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
