"""Measured against predicted: the comparison table and the per-request file.

The table has one row per metric and statistic (TTFT, TPOT and E2E x mean,
median, p90, p95, p99, in milliseconds) with the measured value, the
predicted one and the error ``100 * (predicted - measured) / measured``.
Requests are matched by position: the workload file's i-th line is the run's
i-th request (the replay checks the counts and lengths agree).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "median", "p90", "p95", "p99")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def statistic(values: np.ndarray, stat: str) -> float:
    """``stat`` (mean, median, pNN) of the finite ``values``; NaN when there are none."""
    v = values[np.isfinite(values)]
    if not v.size:
        return float("nan")
    if stat == "mean":
        return float(v.mean())
    if stat == "median":
        return float(np.percentile(v, 50))
    return float(np.percentile(v, float(stat[1:])))


def comparison_rows(measured: dict[str, np.ndarray], predicted: dict[str, np.ndarray]
                    ) -> list[dict[str, float | str]]:
    """One row per metric and statistic: ``metric, measured, predicted, error_pct`` (ms)."""
    rows: list[dict[str, float | str]] = []
    for m in METRICS:
        for s in STATS:
            a = statistic(measured[m], s)
            b = statistic(predicted[m], s)
            err = 100.0 * (b - a) / a if a else float("nan")
            rows.append({"metric": f"{m}_{s}_ms", "measured": a, "predicted": b,
                         "error_pct": err})
    return rows


def format_table(rows: list[dict[str, float | str]], title: str = "") -> str:
    """The comparison as aligned text, one block per metric."""
    lines = [title] if title else []
    lines.append(f"{'metric':<16}{'measured':>12}{'predicted':>12}{'error':>10}")
    last = None
    for r in rows:
        name = str(r["metric"])
        m, s = name.split("_")[:2]
        if last is not None and m != last:
            lines.append("")
        last = m
        lines.append(f"{LABELS[m] + ' ' + s + ' (ms)':<16}{float(r['measured']):>12.1f}"
                     f"{float(r['predicted']):>12.1f}{float(r['error_pct']):>+9.1f}%")
    return "\n".join(lines)


def write_comparison(path: Path, rows: list[dict[str, float | str]]) -> None:
    """``comparison.csv``: metric, measured, predicted, error_pct."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["metric", "measured", "predicted", "error_pct"])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_requests(path: Path, request_ids: list[str], measured: dict[str, np.ndarray],
                   predicted: dict[str, np.ndarray]) -> None:
    """``requests.csv``: request_id, then measured and predicted ttft_ms, tpot_ms, e2e_ms."""
    cols = [f"{w}_{m}_ms" for m in METRICS for w in ("measured", "predicted")]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["request_id", *cols])
        for i, rid in enumerate(request_ids):
            row = [rid]
            for m in METRICS:
                for src in (measured, predicted):
                    v = float(src[m][i])
                    row.append(f"{v:.6g}" if np.isfinite(v) else "")
            w.writerow(row)
