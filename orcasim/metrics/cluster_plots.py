"""Cluster plots: routing, queue length and KV memory per replica over time, and the
TTFT breakdown of disaggregation.

Imported only when plots are written (see :mod:`orcasim.metrics.plots`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.metrics.plots import _finish, _pyplot, run_title, time_unit

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from orcasim.metrics.results import Results

#: the stages of a disaggregated request up to its first decode step
STAGES = ("queue at prefill", "prefill", "decode block reservation", "link queue",
          "KV transfer", "decode queue")


def replica_kv(ax: Axes, v: Any, replicas: list[str]) -> None:
    """Each replica's KV blocks allocated, % of its capacity, over time (one line each)."""
    kv = v.kv_series
    if kv is not None and "replica" in kv:
        t = (kv["t_start"] + kv["t_end"]) / 2
        for rep in replicas:
            cap = v.summary.get(f"replica.{rep}.kv_capacity_tokens")
            sel = kv["replica"] == rep
            if cap and sel.any():
                ax.plot(t[sel], 100 * kv["allocated"][sel] / cap, drawstyle="steps-mid",
                        lw=0.8, label=rep)
        if len(replicas) <= 8:
            ax.legend(fontsize="x-small", loc="upper right")
    ax.set_ylim(0, 100)
    ax.set_ylabel("KV allocated (% of replica)")
    ax.grid(True, alpha=0.3)


def stage_means(columns: dict[str, Any]) -> np.ndarray:
    """Mean seconds of each of :data:`STAGES` over the requests that reached a decode replica
    (for a colocated run: over the requests with a first token, transfer stages 0)."""
    c = columns
    arrival, start, first = (np.asarray(c[k], dtype=np.float64)
                             for k in ("arrival", "first_scheduled", "first_token"))
    if "decode_start" in c:
        reserve, link, move, dec = (np.asarray(c[k], dtype=np.float64) for k in
                                    ("kv_reserve_wait", "kv_link_wait", "kv_transfer_time",
                                     "decode_start"))
        sel = np.isfinite(dec)
        stages = [start - arrival, first - start, reserve, link, move,
                  dec - (first + reserve + link + move)]
    else:
        sel = np.isfinite(first)
        zero = np.zeros_like(first)
        stages = [start - arrival, first - start, zero, zero, zero, zero]
    if not sel.any():
        return np.zeros(len(STAGES))
    return np.array([float(s[sel].mean()) for s in stages])


def ttft_breakdown(results: Results) -> Figure:
    """Per variant, the mean time of each stage from arrival to the first decode step
    (disaggregated prefill/decode): queue, prefill, reservation, link, transfer, decode."""
    plt = _pyplot()
    names = list(results)
    means = np.array([stage_means(results[n].columns) for n in names])
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(names) + 2.6))
    left = np.zeros(len(names))
    y = np.arange(len(names))
    for k, stage in enumerate(STAGES):
        ax.barh(y, means[:, k], left=left, color=f"C{k}", label=stage)
        left += means[:, k]
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel(f"mean time from arrival ({time_unit(results)})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    return _finish(fig, f"{run_title(results)}\nTTFT breakdown: arrival to the first decode "
                   "step (requests that reached a decode replica)")


def replicas_figure(results: Results) -> Figure:
    """Per replica: requests routed to it, its queue length and its KV memory use over time
    (cluster runs)."""
    plt = _pyplot()
    names = [n for n in results if "num_replicas" in results[n].summary]
    fig, axes = plt.subplots(len(names), 3, figsize=(15, 2.6 * len(names) + 0.9),
                             squeeze=False, gridspec_kw={"width_ratios": [1, 2.2, 2.2]})
    unit = time_unit(results)
    for row, name in zip(axes, names, strict=True):
        v = results[name]
        shares = {k.split(".")[1]: val for k, val in v.summary.items()
                  if k.startswith("replica.") and k.endswith(".routed_share")}
        row[0].bar(list(shares), [100 * x for x in shares.values()], color="tab:blue")
        row[0].set_ylabel("requests routed (%)")
        row[0].set_title(name, fontsize="medium")
        row[0].tick_params(axis="x", labelrotation=90, labelsize="small")
        s = v.step_series
        if "replica" in s:
            s = s.assign(t=(s["t_start"] + s["t_end"]) / 2)
            for k, rep in enumerate(shares):
                d = s[s["replica"] == k]
                row[1].step(d["t"], d["num_waiting"], where="mid", lw=0.8, label=rep)
        row[1].set_ylabel("requests waiting")
        row[1].grid(True, alpha=0.3)
        if len(shares) <= 8:
            row[1].legend(fontsize="x-small", loc="upper right")
        replica_kv(row[2], v, list(shares))
    axes[-1, 1].set_xlabel(f"time ({unit})")
    axes[-1, 2].set_xlabel(f"time ({unit})")
    return _finish(fig, f"{run_title(results)}\nrouting, per-replica queue length and KV use")
