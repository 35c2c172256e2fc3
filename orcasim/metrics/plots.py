"""Plots of a run (matplotlib), imported only when plots are written.

- ``gantt.png``: each request's lifetime, waiting (grey) then running (blue),
  one panel per variant, labelled by request name, over the full time range
  of the requests it shows (the title says "first N of M" when it shows a part);
- ``latency_cdf.png``: empirical CDFs of TTFT, TPOT and E2E per variant, one row
  of panels per request class when the workload has classes. Queue delay is
  left out: it is TTFT minus the first prefill step, so its curve repeats the
  TTFT panel. Each panel's x axis is logarithmic when its values span more than
  two decades, so a single outlier cannot flatten the other curves;
- ``timeline.png``: batch size and queue length over time per variant;
- ``kv_usage.png``: KV memory allocated and holding tokens over time (memory runs).

Every figure's title names the scenario, the variants with their settings, the
request count and the seed. Time is labelled "steps" for a constant step time
of 1 (worked examples), seconds otherwise. The CDFs are drawn with numpy and
matplotlib directly (sort + step): seaborn and scipy are not imported, which
keeps a small run's plotting well under a second.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.metrics.request_table import num_rows
from orcasim.metrics.summary import request_latencies
from orcasim.request import RequestState

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from orcasim.metrics.results import Results

#: seaborn's "deep" palette, spelled out so that drawing does not import seaborn (and scipy)
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C", "#CCB974", "#64B5CD")
LINESTYLES = ("-", "--", ":", "-.")
#: a panel's latency axis turns logarithmic when max / min of its positive values exceeds this
LOG_SPAN = 100.0
#: above this many requests the Gantt chart labels them by id ticks instead of by name
MAX_NAMED_ROWS = 40

#: an ECDF of more samples is drawn through this many of its quantiles (a line of a million
#: points looks the same and costs seconds)
MAX_CDF_POINTS = 2000

CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E latency"))


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def colors(names: Iterable[str]) -> dict[str, str]:
    """One palette colour per name, in order (cycling after ten)."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def wants_log(values: Any, span: float = LOG_SPAN) -> bool:
    """Whether ``values`` (positive, finite ones) span more than ``span`` (two decades)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    return bool(x.size >= 2 and x.max() / x.min() > span)


def time_unit(results: Results) -> str:
    """``"steps"`` when every variant's latency is a constant step time of 1, else ``"s"``."""
    for v in results.values():
        lat = v.config.latency
        if lat.type != "constant" or getattr(lat.params, "step_time", None) != 1.0:
            return "s"
    return "steps"


def num_requests(results: Results) -> int:
    """Requests per variant (the largest, should the variants differ)."""
    return max((num_rows(v.columns) for v in results.values()), default=0)


def _leaves(d: Mapping[str, Any]) -> list[str]:
    """Override leaves as ``key=value``; a component's ``type`` as its bare value."""
    out: list[str] = []
    for k, val in d.items():
        if isinstance(val, Mapping):
            out += _leaves(val)
        else:
            out.append(str(val) if k == "type" else f"{k}={val}")
    return out


def variant_settings(results: Results) -> str:
    """Each variant with its overrides, e.g. ``static (static, max_batch=2) vs continuous``."""
    overrides = getattr(results.scenario.model, "variants", None) or {}
    parts = []
    for name in results:
        text = ", ".join(_leaves(overrides.get(name) or {}))
        parts.append(f"{name} ({text})" if text else name)
    return " vs ".join(parts)


def run_title(results: Results) -> str:
    """``"<scenario>: <variants>, <N> requests, seed <s>"``; long variant lists on own lines."""
    settings = variant_settings(results)
    tail = f"{num_requests(results):,} requests, seed {results.seed}"
    if len(settings) <= 80:
        return f"{results.scenario.name}: {settings}, {tail}"
    return "\n".join([f"{results.scenario.name}: {len(results)} variants, {tail}",
                      *textwrap.wrap(settings, 120)])


def _finish(fig: Figure, title: str) -> Figure:
    """Title and lay out ``fig`` once. The layout engine that ``tight_layout`` leaves behind is
    dropped, so that saving does not lay the figure out again in an extra drawing pass (which
    only a constrained layout needs): a fifth less time per figure, same pixels."""
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.set_layout_engine(None)
    return fig


def _int_ticks(ax: Axes, axis: str = "y") -> None:
    from matplotlib.ticker import MaxNLocator

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_locator(MaxNLocator(integer=True))


def gantt(results: Results, num_requests: int | None = None) -> Figure:
    """Lifetime Gantt chart of the first ``num_requests`` requests of each variant.

    Requests are labelled by name when the workload names them (and there are
    few enough to read), and the time axis spans every shown request fully.
    """
    plt = _pyplot()
    names = list(results)
    unit = time_unit(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.3 * len(names) + 0.9),
                             sharex=True, squeeze=False)
    shown, total, t_end = 0, 0, 0.0
    for ax, name in zip(axes[:, 0], names, strict=True):
        v = results[name]
        n = num_requests or v.config.output.gantt_requests
        df = v.first_requests(n)  # the columns are sorted by id
        shown, total = max(shown, len(df)), max(total, num_rows(v.columns))
        t_end = max(t_end, gantt_panel(ax, df, unit))
        ax.set_title(f"{name}: p99 E2E {v.summary['e2e_p99']:.3g} {unit}", fontsize="medium")
    axes[0, 0].set_xlim(0, t_end * 1.02 if t_end > 0 else 1)
    axes[0, 0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize="small",
                      frameon=False)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    what = f"first {shown:,} of {total:,} requests" if shown < total else f"all {total:,} requests"
    return _finish(fig, f"{run_title(results)}\nrequest lifetimes, {what}")


def gantt_panel(ax: Axes, df: pd.DataFrame, unit: str = "s") -> float:
    """Draw one variant's lifetime bars, top to bottom (for runs and sweep reports); return the
    latest time shown."""
    start = df["first_scheduled"].fillna(df["finish"]).fillna(df["arrival"])
    end = df["finish"].fillna(start)
    rows = np.arange(len(df))
    ax.barh(rows, start - df["arrival"], left=df["arrival"], height=0.8, color="0.8",
            label="waiting")
    ax.barh(rows, end - start, left=start, height=0.8, color="tab:blue", alpha=0.7,
            label="running")
    bad = df["state"].to_numpy() != "finished"
    if bad.any():
        ax.scatter(df["arrival"][bad], rows[bad], marker="x", color="tab:red", s=18,
                   label="rejected/aborted", zorder=3)
    named = "name" in df and (df["name"].astype(str) != df["id"].astype(str)).any()
    if named and len(df) <= MAX_NAMED_ROWS:
        ax.set_yticks(rows, df["name"].astype(str).tolist())
        ax.set_ylabel("request")
    else:
        ax.set_yticks(rows[:: max(1, len(df) // 8)], df["id"].to_numpy()[:: max(1, len(df) // 8)])
        ax.set_ylabel("request id")
    ax.set_ylim(len(df) - 0.5, -0.5)
    ax.grid(True, axis="x", alpha=0.3)
    if unit == "steps":
        _int_ticks(ax, "x")
    return float(np.nanmax(end.to_numpy(float), initial=0.0))


def latency_cdfs(results: Results) -> Figure:
    """ECDFs of TTFT, TPOT and E2E, one line per variant, one row per request class.

    A workload with classes gets a row of panels per class (all requests
    mixed together hide the trade-off a class study is about); each panel
    decides from its own data between a linear and a log x axis. Each
    variant's latencies are reduced to the points drawn before the next
    variant's are computed (millions of requests).
    """
    plt = _pyplot()
    metrics = [m for m, _ in CDF_METRICS]
    done = {name: v.columns["state"] == int(RequestState.FINISHED) for name, v in results.items()}
    labels = {}  # variant -> class of each finished request (empty: no classes)
    for name, v in results.items():
        cls = v.columns["cls"]
        if any(x is not None for x in cls):
            cls = np.asarray(cls, dtype=object)
            labels[name] = cls if done[name].all() else cls[done[name]]
        else:  # no classes: one marker array, not an object per request
            labels[name] = np.empty(0, dtype=object)
    classes = [c for c in dict.fromkeys(x for cls in labels.values()
                                        for x in cls[cls != None] if x != "")]  # noqa: E711
    rows: list[Any] = classes if len(classes) > 1 else [None]
    curves: dict[tuple[Any, str], dict[str, Curve | None]] = {
        (cls, m): {} for cls in rows for m in metrics}
    for name, v in results.items():
        c, every = v.columns, bool(done[name].all())  # all finished: no copies of the columns
        sub = c if every else {k: c[k][done[name]] for k in
                               ("arrival", "first_scheduled", "first_token", "finish",
                                "num_output_tokens")}
        lat = request_latencies(sub)
        del sub
        for m in metrics:
            for cls in rows:
                s = lat[m] if cls is None else lat[m][labels[name] == cls]
                curves[(cls, m)][name] = ecdf_curve(s)
            del lat[m]
        del lat
    unit = time_unit(results)
    fig, axes = plt.subplots(len(rows), len(CDF_METRICS),
                             figsize=(4.2 * len(CDF_METRICS), 3.1 * len(rows) + 0.9),
                             squeeze=False, sharey=True)
    palette = colors(results)
    for i, cls in enumerate(rows):
        for j, (col, label) in enumerate(CDF_METRICS):
            ax = axes[i, j]
            draw_ecdfs(ax, curves[(cls, col)], palette)
            ax.set_xlabel(f"{label} ({unit})")
            if cls is not None:
                ax.set_title(f"class {cls}", fontsize="medium")
        axes[i, 0].set_ylabel("fraction of requests")
    axes[0, -1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _finish(fig, f"{run_title(results)}\nlatency CDFs of finished requests")


#: an ECDF as drawn: its points (x, y), and the count, least and greatest of its positive values
Curve = tuple[np.ndarray, np.ndarray, int, float, float]


def ecdf_curve(s: np.ndarray) -> Curve | None:
    """The ECDF of the finite values of ``s`` through at most :data:`MAX_CDF_POINTS` of its
    points (exact ones, ends included); None when there are none."""
    x = np.sort(s[np.isfinite(s)])
    if x.size == 0:
        return None
    first_pos = int(np.searchsorted(x, 0.0, side="right"))
    npos = x.size - first_pos
    lo, hi = (float(x[first_pos]), float(x[-1])) if npos else (np.nan, np.nan)
    if x.size > MAX_CDF_POINTS:  # the ECDF at evenly spaced quantiles, ends included
        idx = np.unique(np.linspace(0, x.size - 1, MAX_CDF_POINTS).round().astype(np.int64))
        return x[idx], (idx + 1) / x.size, npos, lo, hi
    return x, np.arange(1, x.size + 1) / x.size, npos, lo, hi


def ecdf_panel(ax: Axes, samples: Mapping[str, np.ndarray], palette: Mapping[str, str]) -> None:
    """Step ECDF per sample; a log x axis when the pooled values span > two decades."""
    draw_ecdfs(ax, {name: ecdf_curve(np.asarray(s, dtype=float))
                    for name, s in samples.items()}, palette)


def draw_ecdfs(ax: Axes, curves: Mapping[str, Curve | None], palette: Mapping[str, str]
               ) -> None:
    """Draw :func:`ecdf_curve` curves; a log x axis when their positive values together span
    more than :data:`LOG_SPAN` (as :func:`wants_log` of the pooled samples)."""
    drawn = [c for c in curves.values() if c is not None]
    npos = sum(c[2] for c in drawn)
    lo = min((c[3] for c in drawn if c[2]), default=np.nan)
    hi = max((c[4] for c in drawn if c[2]), default=np.nan)
    for name, c in curves.items():
        if c is not None:
            ax.step(c[0], c[1], where="post", color=palette[name], lw=1.4, label=name)
    if npos >= 2 and hi / lo > LOG_SPAN:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.3, hi * 1.3)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3, which="major")


def timeline(results: Results) -> Figure:
    """Batch size and queue length over time (per-bin means for long runs)."""
    plt = _pyplot()
    s = results.step_series
    s = s.assign(t=(s["t_start"] + s["t_end"]) / 2)
    binned = bool((s["num_steps"] > 1).any()) if "num_steps" in s else False
    mean = "mean " if binned else ""
    unit = time_unit(results)
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.9), sharex=True)
    palette = colors(results)
    for name in results:
        d = s[s["variant"] == name]
        if "replica" in d and d["replica"].notna().any():
            d = cluster_totals(d)
        axes[0].step(d["t"], d["batch_size"], where="mid", color=palette[name], lw=1, label=name)
        axes[1].step(d["t"], d["num_waiting"], where="mid", color=palette[name], lw=1)
    axes[0].set_ylabel(f"{mean}batch size\n(requests)")
    axes[1].set_ylabel(f"{mean}requests waiting\n(requests)")
    axes[1].set_xlabel(f"time ({unit})")
    axes[0].legend(fontsize="small", loc="upper right")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _int_ticks(ax)
    return _finish(fig, f"{run_title(results)}\nbatch size and queue length over time")


def cluster_totals(d: Any, bins: int = 400) -> Any:
    """A cluster's per-replica step rows as cluster totals over time: per time bin, each
    replica's mean batch size and queue length, summed over replicas."""
    d = d[d["replica"].notna()]
    t = d["t"].to_numpy()
    edges = np.linspace(float(t.min()), float(np.nextafter(t.max(), np.inf)), bins + 1)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    per = d.assign(bin=b).groupby(["bin", "replica"])[["batch_size", "num_waiting"]].mean()
    tot = per.groupby(level="bin").sum()
    mid = (edges[:-1] + edges[1:]) / 2
    return tot.assign(t=mid[tot.index.to_numpy()]).reset_index(drop=True)


def single_kv(v: Any) -> bool:
    """True if ``v`` has one engine's KV series (a cluster's has a ``replica`` column)."""
    return v.kv_series is not None and "replica" not in v.kv_series


def kv_timeline(results: Results) -> Figure:
    """KV memory allocated and holding tokens, % of capacity, over time (memory runs)."""
    plt = _pyplot()
    names = [n for n in results if single_kv(results[n])]
    unit = time_unit(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 * len(names) + 0.9), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        v = results[name]
        kv = v.kv_usage
        cap = v.summary["kv_capacity_tokens"] / 100
        t = (kv["t_start"] + kv["t_end"]) / 2
        ax.fill_between(t, 0, kv["allocated"] / cap, step="mid", alpha=0.35, label="allocated")
        ax.plot(t, kv["tokens"] / cap, drawstyle="steps-mid", lw=0.8, label="real tokens")
        ax.set_ylim(0, 100)
        ax.set_ylabel("KV capacity (%)")
        ax.set_title(name, fontsize="medium")
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel(f"time ({unit})")
    return _finish(fig, f"{run_title(results)}\nKV-cache memory over time")


def write_all(results: Results, out: Path) -> list[Path]:
    """Write every plot as PNG into ``out``; return the paths."""
    plt = _pyplot()
    paths = []
    makers = [("gantt", gantt), ("latency_cdf", latency_cdfs), ("timeline", timeline)]
    if any(single_kv(v) for v in results.values()):  # a cluster's is in replicas.png
        makers.append(("kv_usage", kv_timeline))
    if any(v.summary.get("num_replicas", 1) > 1 for v in results.values()):
        from orcasim.metrics.cluster_plots import replicas_figure

        makers.append(("replicas", replicas_figure))
    if any("kv_reserve_wait" in v.columns for v in results.values()):
        from orcasim.metrics.cluster_plots import ttft_breakdown

        makers.append(("ttft_breakdown", ttft_breakdown))
    for name, make in makers:
        fig = make(results)
        p = out / f"{name}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths
