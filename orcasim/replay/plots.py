"""Plots of a replay (matplotlib, imported only when plots are written).

- ``latency_cdf.png``: empirical CDFs of TTFT, TPOT and E2E, measured against
  predicted, one panel each;
- ``running_waiting.png``: running and waiting requests over time, the run's
  ``timeseries.csv`` (once a second) against the simulated steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orcasim.metrics.plots import PALETTE, _pyplot
from orcasim.replay.compare import LABELS, METRICS


def _cdf(ax, values: np.ndarray, label: str, color: str) -> None:  # type: ignore[no-untyped-def]
    v = np.sort(values[np.isfinite(values)])
    if v.size:
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, color=color)


def latency_cdfs(path: Path, measured: dict[str, np.ndarray], predicted: dict[str, np.ndarray],
                 title: str) -> None:
    """``latency_cdf.png``: one panel per metric, measured and predicted CDFs (ms)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(METRICS), figsize=(13, 3.8))
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.88, wspace=0.25)
    for ax, m in zip(axes, METRICS, strict=True):
        _cdf(ax, measured[m], "measured", PALETTE[0])
        _cdf(ax, predicted[m], "predicted", PALETTE[1])
        ax.set_xlabel(f"{LABELS[m]} (ms)")
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def running_waiting(path: Path, measured: dict[str, np.ndarray] | None,
                    steps: dict[str, np.ndarray], title: str) -> None:
    """``running_waiting.png``: running and waiting requests over time, measured and predicted.

    ``steps`` holds the simulated steps' ``t_start``, ``batch_size`` (running
    requests) and ``num_waiting``; ``measured`` the run's ``t``, ``running``
    and ``waiting`` (None when the run has no timeseries.csv).
    """
    plt = _pyplot()
    steps = engines_summed(steps)
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1, top=0.92, hspace=0.08)
    for ax, (mkey, skey, name) in zip(axes, (("running", "batch_size", "running"),
                                             ("waiting", "num_waiting", "waiting")), strict=True):
        if measured is not None:
            ax.plot(measured["t"], measured[mkey], color=PALETTE[0], label="measured",
                    drawstyle="steps-post")
        ax.plot(steps["t_start"], steps[skey], color=PALETTE[1], label="predicted",
                drawstyle="steps-post", linewidth=0.8)
        ax.set_ylabel(f"{name} requests")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right")
    axes[1].set_xlabel("time (s; measured: the run's timeseries.csv clock)")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def engines_summed(steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Running and waiting requests of all engines at every step start of any of them.

    A data-parallel replay's step series holds every engine's rows with a
    ``replica`` column; the measured timeseries counts the engines together,
    so each engine's last value at every step start is summed. One engine's
    series is returned as it is.
    """
    if "replica" not in steps:
        return steps
    t = np.asarray(steps["t_start"], dtype=float)
    rep = np.asarray(steps["replica"])
    grid = np.unique(t)
    out = {"t_start": grid, "batch_size": np.zeros(len(grid)), "num_waiting": np.zeros(len(grid))}
    for r in np.unique(rep):
        mine = np.flatnonzero(rep == r)
        mine = mine[np.argsort(t[mine], kind="stable")]
        at = np.searchsorted(t[mine], grid, side="right") - 1
        seen = at >= 0
        for key in ("batch_size", "num_waiting"):
            vals = np.asarray(steps[key], dtype=float)[mine]
            out[key][seen] += vals[at[seen]]
    return out
