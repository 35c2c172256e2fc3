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
