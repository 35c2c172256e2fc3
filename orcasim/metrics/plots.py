"""Plots of a run (seaborn/matplotlib), imported only when plots are written.

- ``gantt.png``: each request's lifetime, waiting (grey) then running (blue),
  one panel per variant, as in the seed notebook;
- ``latency_cdf.png``: empirical CDFs of queue delay, TTFT, TPOT and E2E per variant;
- ``timeline.png``: batch size and queue length over time per variant;
- ``kv_usage.png``: KV memory allocated and holding tokens over time (memory runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from orcasim.metrics.results import Results


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def gantt(results: Results, num_requests: int | None = None) -> Figure:
    """Lifetime Gantt chart of the first ``num_requests`` requests of each variant."""
    plt = _pyplot()
    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.3 * len(names) + 0.6),
                             sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        v = results[name]
        n = num_requests or v.config.output.gantt_requests
        df = v.requests.sort_values("id").head(n)
        ax.barh(df["id"], df["first_scheduled"] - df["arrival"], left=df["arrival"], height=0.8,
                color="0.8", label="waiting")
        ax.barh(df["id"], df["finish"] - df["first_scheduled"], left=df["first_scheduled"],
                height=0.8, color="tab:blue", alpha=0.7, label="running")
        ax.set_ylabel("request id")
        ax.set_title(f"{name}: p99 e2e {v.summary['e2e_p99']:.3g} s")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def latency_cdfs(results: Results) -> Figure:
    """ECDFs of queue delay, TTFT, TPOT and E2E, one line per variant."""
    import seaborn as sns

    plt = _pyplot()
    df = results.requests
    df = df[df["state"] == "finished"]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5))
    for ax, (col, label) in zip(
        axes.flat,
        [("queue_delay", "queue delay (s)"), ("ttft", "TTFT (s)"), ("tpot", "TPOT (s)"),
         ("e2e", "E2E latency (s)")],
        strict=True,
    ):
        sns.ecdfplot(data=df, x=col, hue="variant", ax=ax)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def timeline(results: Results) -> Figure:
    """Mean batch size and queue length over time (binned for long runs)."""
    import seaborn as sns

    plt = _pyplot()
    s = results.step_series
    s = s.assign(t=(s["t_start"] + s["t_end"]) / 2)
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    sns.lineplot(data=s, x="t", y="batch_size", hue="variant", ax=axes[0], drawstyle="steps-mid")
    sns.lineplot(data=s, x="t", y="num_waiting", hue="variant", ax=axes[1], drawstyle="steps-mid")
    axes[0].set_ylabel("batch size")
    axes[1].set_ylabel("requests waiting")
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def kv_timeline(results: Results) -> Figure:
    """KV memory allocated and holding tokens, % of capacity, over time (memory runs)."""
    plt = _pyplot()
    names = [n for n in results if results[n].kv_series is not None]
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 * len(names) + 0.6), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        v = results[name]
        kv = v.kv_usage
        cap = v.summary["kv_capacity_tokens"] / 100
        t = (kv["t_start"] + kv["t_end"]) / 2
        ax.fill_between(t, 0, kv["allocated"] / cap, step="mid", alpha=0.35, label="allocated")
        ax.plot(t, kv["tokens"] / cap, drawstyle="steps-mid", lw=0.8, label="real tokens")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of KV")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def write_all(results: Results, out: Path) -> list[Path]:
    """Write every plot as PNG into ``out``; return the paths."""
    plt = _pyplot()
    paths = []
    makers = [("gantt", gantt), ("latency_cdf", latency_cdfs), ("timeline", timeline)]
    if any(v.kv_series is not None for v in results.values()):
        makers.append(("kv_usage", kv_timeline))
    for name, make in makers:
        fig = make(results)
        p = out / f"{name}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths
