"""The figures of a sweep report (seaborn/matplotlib, imported only here).

Each function takes plain DataFrames and returns a matplotlib Figure, or None
when the data has nothing to show (no swept number, no rejections...), so the
report can say so instead of drawing an empty chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
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


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _palette(names: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    import seaborn as sns

    return dict(zip(names, sns.color_palette("deep", len(names)), strict=True))


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
                label = str(h) if c is None else f"{h}, {col}={c}"
                color = colors[str(h)]
                ax.plot(sel[x], sel["mean"], styles[k % 4], marker="o", ms=4, color=color,
                        label=label)
                lo, hi = sel["low"].to_numpy(float), sel["high"].to_numpy(float)
                if np.isfinite(lo).any():
                    ax.fill_between(sel[x], lo, hi, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(x)
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
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def latency_cdfs(req: pd.DataFrame, facet: str | None = None) -> Figure:
    """ECDFs of TTFT and E2E of finished requests: colour = variant, line style = class.

    ``req`` holds the kept per-request rows with a ``variant`` column (and
    ``facet``, one column of panels per value).
    """
    plt = _plt()
    df = req[req["state"] == "finished"]
    facets = list(dict.fromkeys(df[facet])) if facet else [None]
    classes = sorted(df["cls"].dropna().unique()) if "cls" in df else []
    by_class = len(classes) > 1
    fig, axes = plt.subplots(2, len(facets), figsize=(4.2 * len(facets) + 1, 6.4),
                             squeeze=False, sharey=True)
    variants = list(dict.fromkeys(df["variant"]))
    palette = _palette(variants)
    styles = ["-", "--", ":", "-."]
    for j, f in enumerate(facets):
        d = df if f is None else df[df[facet] == f]
        for i, (colname, label) in enumerate((("ttft", "TTFT (s)"), ("e2e", "E2E latency (s)"))):
            ax = axes[i, j]
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
            ax.set_xlabel(label)
            ax.set_ylabel("proportion" if j == 0 else "")
            ax.grid(True, alpha=0.3)
            if f is not None and i == 0:
                ax.set_title(f"{facet} = {f}", fontsize="medium")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, -1].legend(handles, labels, fontsize="small", loc="lower right")
    fig.tight_layout()
    return fig


def gantt(req: pd.DataFrame, num_requests: int = 60) -> Figure:
    """Lifetime of the first ``num_requests`` requests per variant: waiting grey, running blue."""
    plt = _plt()
    names = list(dict.fromkeys(req["variant"]))
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.4 * len(names) + 0.6), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        d = req[req["variant"] == name].sort_values("id").head(num_requests)
        start = d["first_scheduled"].fillna(d["finish"]).fillna(d["arrival"])
        end = d["finish"].fillna(start)
        ax.barh(d["id"], start - d["arrival"], left=d["arrival"], height=0.8, color="0.78",
                label="waiting")
        ax.barh(d["id"], end - start, left=start, height=0.8, color="tab:blue", alpha=0.75,
                label="running")
        bad = d[d["state"] != "finished"]
        if not bad.empty:
            ax.scatter(bad["arrival"], bad["id"], marker="x", color="tab:red", s=18,
                       label="rejected/aborted", zorder=3)
        ax.set_ylabel("request id")
        ax.set_title(name, fontsize="medium", loc="left")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def over_time(series: pd.DataFrame) -> Figure:
    """Queue length, batch size and (when recorded) KV usage over time, one line per variant."""
    import seaborn as sns

    plt = _plt()
    s = series.assign(t=(series["t_start"] + series["t_end"]) / 2)
    panels = [("num_waiting", "requests waiting"), ("batch_size", "batch size")]
    panels += [(c, c.replace("_", " ")) for c in kv_columns(series)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.3 * len(panels) + 0.5),
                             sharex=True, squeeze=False)
    palette = _palette(list(dict.fromkeys(s["variant"])))
    for ax, (col, label) in zip(axes[:, 0], panels, strict=True):
        sns.lineplot(data=s, x="t", y=col, hue="variant", palette=palette, ax=ax,
                     drawstyle="steps-mid", legend=ax is axes[0, 0], linewidth=1)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
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
