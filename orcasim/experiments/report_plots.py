"""The figures of a sweep report (seaborn/matplotlib, imported only here).

Each function takes plain DataFrames and returns a matplotlib Figure, or None
when the data has nothing to show (no swept number, no rejections...), so the
report can say so instead of drawing an empty chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from orcasim.metrics.plots import colors, gantt_panel, wants_log

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LABELS = {
    "throughput_tok_s": "throughput (tok/s)",
    "requests_per_s": "finished requests / s",
    "ttft_p50": "TTFT p50 (s)",
    "ttft_p99": "TTFT p99 (s)",
    "tpot_p50": "TPOT p50 (s)",
    "tpot_p99": "TPOT p99 (s)",
    "e2e_p50": "E2E p50 (s)",
    "e2e_p99": "E2E p99 (s)",
    "queue_delay_p99": "queue delay p99 (s)",
    "num_rejected": "rejected requests",
    "goodput_req_s": "goodput (req/s)",
}


#: swept parameters by schema path: (what it is, unit); others fall back to their last path part
PARAM_LABELS: dict[str, tuple[str, str]] = {
    "workload.arrival.rate": ("arrival rate", "req/s"),
    "workload.num_requests": ("requests", "count"),
    "workload.arrival.cv": ("arrival CV", ""),
    "policy.max_batch": ("max batch size", "requests"),
    "policy.token_budget": ("token budget", "tokens/step"),
    "policy.watermark": ("KV watermark", "share of KV"),
    "policy.chunk_size": ("prefill chunk", "tokens"),
    "memory.num_blocks": ("KV blocks", "blocks"),
    "memory.block_size": ("KV block size", "tokens"),
    "engine.latency.step_time": ("step time", "s"),
    "clients.patience": ("client patience", "s"),
}


def param_label(path: str) -> str:
    """An axis label for a swept schema path: ``workload.arrival.rate`` -> ``arrival rate (req/s)``.

    Common fields come from :data:`PARAM_LABELS`; any other path reads as its last
    part with spaces for underscores.
    """
    name, unit = PARAM_LABELS.get(path, (path.rsplit(".", 1)[-1].replace("_", " "), ""))
    return f"{name} ({unit})" if unit else name


def param_value(path: str, value: object) -> str:
    """``arrival rate = 1.5 req/s``: a panel title for one value of a swept parameter."""
    name, unit = PARAM_LABELS.get(path, (path.rsplit(".", 1)[-1].replace("_", " "), ""))
    return f"{name} = {value}" + (f" {unit}" if unit and unit != "count" else "")


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _palette(names: Sequence[str]) -> dict[str, str]:
    return colors(names)


def _log_if_wide(ax: Axes, values: np.ndarray, axis: str = "y") -> None:
    """Log-scale a latency axis whose positive values span more than two decades."""
    if wants_log(values):
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def _int_ticks(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def metric_vs_param(agg: pd.DataFrame, x: str, metrics: Sequence[str], hue: str = "variant",
                    col: str | None = None) -> Figure:
    """Each metric's mean against ``x``, one line per ``hue`` value, 95% CI as a band.

    ``agg`` is :func:`orcasim.experiments.stats.aggregate`'s long table. With
    ``col``, each of its values gets its own line style.
    """
    plt = _plt()
    metrics = [m for m in metrics if m in set(agg["metric"])]
    ncols = 2 if len(metrics) > 1 else 1
    nrows = (len(metrics) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.4 * nrows), squeeze=False)
    hues = list(dict.fromkeys(agg[hue])) if hue in agg else [None]
    colors = _palette([str(h) for h in hues])
    styles = ["-", "--", ":", "-."]
    cols = list(dict.fromkeys(agg[col])) if col else [None]
    for ax, m in zip(axes.flat, metrics, strict=False):
        d = agg[agg["metric"] == m]
        if _is_latency(m):
            _log_if_wide(ax, d[["mean", "low", "high"]].to_numpy(float).ravel())
        for h in hues:
            for k, c in enumerate(cols):
                sel = d
                if h is not None:
                    sel = sel[sel[hue] == h]
                if c is not None:
                    sel = sel[sel[col] == c]
                sel = sel.sort_values(x)
                if sel.empty:
                    continue
                label = str(h) if c is None else f"{h}, {param_value(col or '', c)}"
                color = colors[str(h)]
                ax.plot(sel[x], sel["mean"], styles[k % 4], marker="o", ms=4, color=color,
                        label=label)
                lo, hi = sel["low"].to_numpy(float), sel["high"].to_numpy(float)
                if np.isfinite(lo).any():
                    ax.fill_between(sel[x], lo, hi, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(param_label(x))
        ax.set_ylabel(LABELS.get(m, m))
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(4, len(labels)),
                   frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _is_latency(metric: str) -> bool:
    return metric.startswith(("ttft", "tpot", "itl", "e2e", "queue_delay"))


def metric_bars(agg: pd.DataFrame, point: str, metrics: Sequence[str]) -> Figure:
    """Each metric's mean per point (a categorical label column ``point``), with 95% CI bars."""
    plt = _plt()
    metrics = [m for m in metrics if m in set(agg["metric"])]
    ncols = 2 if len(metrics) > 1 else 1
    nrows = (len(metrics) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax, m in zip(axes.flat, metrics, strict=False):
        d = agg[agg["metric"] == m]
        labels = d[point].astype(str).tolist()
        colors = list(_palette(labels).values())
        err = d["half_width"].to_numpy(float)
        ax.bar(range(len(d)), d["mean"], yerr=np.where(np.isfinite(err), err, 0),
               color=colors, capsize=4)
        ax.set_xticks(range(len(d)), labels, rotation=20, ha="right", fontsize="small")
        ax.set_ylabel(LABELS.get(m, m))
        if _is_latency(m):
            _log_if_wide(ax, d["mean"].to_numpy(float))
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def latency_cdfs(req: pd.DataFrame, facet: str | None = None) -> Figure:
    """ECDFs of TTFT and E2E of finished requests: colour = variant, line style = class.

    ``req`` holds the kept per-request rows with a ``variant`` column (and
    ``facet``, one column of panels per value). Each panel's x axis is
    logarithmic when its values span more than two decades.
    """
    plt = _plt()
    df = req[req["state"] == "finished"]
    facets = list(dict.fromkeys(df[facet])) if facet else [None]
    fig, axes = plt.subplots(2, len(facets), figsize=(4.2 * len(facets) + 1, 6.4),
                             squeeze=False, sharey=True)
    for j, f in enumerate(facets):
        d = df if f is None else df[df[facet] == f]
        for i, (colname, label) in enumerate((("ttft", "TTFT (s)"), ("e2e", "E2E latency (s)"))):
            ax = axes[i, j]
            _cdf_lines(ax, d, colname)
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of requests" if j == 0 else "")
            ax.grid(True, alpha=0.3)
            if f is not None and i == 0:
                ax.set_title(param_value(facet or "", f), fontsize="medium")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, -1].legend(handles, labels, fontsize="small", loc="lower right")
    fig.tight_layout()
    return fig


def _cdf_lines(ax: Axes, d: pd.DataFrame, colname: str) -> None:
    """One step ECDF per variant (and class, by line style) of column ``colname``."""
    classes = sorted(d["cls"].dropna().unique()) if "cls" in d else []
    by_class = len(classes) > 1
    variants = list(dict.fromkeys(d["variant"]))
    palette = _palette(variants)
    styles = ["-", "--", ":", "-."]
    for v in variants:
        dv = d[d["variant"] == v]
        groups = [(c, dv[dv["cls"] == c]) for c in classes] if by_class else [(None, dv)]
        for k, (c, g) in enumerate(groups):
            x = np.sort(g[colname].to_numpy(float))
            x = x[np.isfinite(x)]
            if x.size == 0:
                continue
            y = np.arange(1, x.size + 1) / x.size
            ax.step(x, y, where="post", color=palette[v], ls=styles[k % 4], lw=1.4,
                    label=v if c is None else f"{v}, class {c}")
    _log_if_wide(ax, d[colname].to_numpy(float), axis="x")


def gantt(req: pd.DataFrame, num_requests: int = 60) -> Figure:
    """Lifetime of the first ``num_requests`` requests per variant: waiting grey, running blue.

    Requests are labelled by name when the workload names them; the title says
    how many of how many requests are shown, and the time axis covers them fully.
    """
    plt = _plt()
    names = list(dict.fromkeys(req["variant"]))
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.4 * len(names) + 0.6), sharex=True,
                             squeeze=False)
    t_end = 0.0
    for ax, name in zip(axes[:, 0], names, strict=True):
        every = req[req["variant"] == name].sort_values("id")
        d = every.head(num_requests)
        t_end = max(t_end, gantt_panel(ax, d))
        what = f"first {len(d):,} of {len(every):,}" if len(d) < len(every) else f"all {len(d):,}"
        ax.set_title(f"{name}: {what} requests", fontsize="medium", loc="left")
    axes[0, 0].set_xlim(0, t_end * 1.02 if t_end > 0 else 1)
    axes[0, 0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize="small",
                      frameon=False)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def over_time(series: pd.DataFrame) -> Figure:
    """Queue length, batch size and (when recorded) KV usage over time, one line per variant."""
    plt = _plt()
    s = series.assign(t=(series["t_start"] + series["t_end"]) / 2)
    panels = [("num_waiting", "mean requests waiting\n(requests)"),
              ("batch_size", "mean batch size\n(requests)")]
    panels += [(c, c.replace("_", " ")) for c in kv_columns(series)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.3 * len(panels) + 0.5),
                             sharex=True, squeeze=False)
    variants = list(dict.fromkeys(s["variant"]))
    palette = _palette(variants)
    for ax, (col, label) in zip(axes[:, 0], panels, strict=True):
        for v in variants:
            d = s[s["variant"] == v].sort_values("t")
            ax.step(d["t"], d[col], where="mid", color=palette[v], lw=1, label=v)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not col.startswith("kv"):
            _int_ticks(ax)
    axes[0, 0].legend(fontsize="small", loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def kv_columns(series: pd.DataFrame) -> list[str]:
    """Series columns about KV-cache memory (recorded by memory-aware policies), if any."""
    return [c for c in series.columns if c.startswith("kv") or c.startswith("num_free_blocks")]


def outcomes(counts: pd.DataFrame) -> Figure | None:
    """Requests rejected or aborted by reason, and preemptions, per variant (None if none)."""
    import seaborn as sns

    plt = _plt()
    if counts.empty or counts["count"].sum() == 0:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.5 * counts["what"].nunique() + 2.2))
    sns.barplot(data=counts, y="what", x="count", hue="variant", ax=ax, orient="h",
                palette=_palette(list(dict.fromkeys(counts["variant"]))))
    ax.set_xlabel("requests (summed over the kept runs)")
    ax.set_ylabel("")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
