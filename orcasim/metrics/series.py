"""A bounded per-step time series: exact for short runs, time-binned for long ones.

Steps arrive in blocks of raw rows. When more than ``capacity`` rows are
held, adjacent rows are merged in pairs, so memory stays under ``capacity``
rows whatever the run length. A merged row keeps its time
span, its number of steps, its busy time and the time integrals of batch
size, tokens and queue length, so time-weighted means stay exact per bin.
"""

from __future__ import annotations

import numpy as np

_FIELDS = ("t_start", "t_end", "num_steps", "busy", "seqs_dt", "tokens_dt", "waiting_dt")


class StepSeries:
    """Per-step (t_start, t_end, batch size, tokens, waiting) rows, merged to stay bounded."""

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 2:
            raise ValueError('"capacity" must be >= 2.')
        self.capacity = capacity
        self._agg: dict[str, np.ndarray] = {f: np.zeros(0) for f in _FIELDS}

    def add_steps(self, t0: np.ndarray, t1: np.ndarray, seqs: np.ndarray, tokens: np.ndarray,
                  waiting: np.ndarray) -> None:
        """Append raw steps (one array element per step), then merge rows to stay bounded."""
        dt = t1 - t0
        raw = {
            "t_start": t0,
            "t_end": t1,
            "num_steps": np.ones_like(t0),
            "busy": dt,
            "seqs_dt": seqs * dt,
            "tokens_dt": tokens * dt,
            "waiting_dt": waiting * dt,
        }
        agg = {f: np.concatenate([self._agg[f], raw[f]]) for f in _FIELDS}
        while len(agg["t_start"]) > self.capacity:
            agg = _merge_pairs(agg)
        self._agg = agg

    def add(self, t0: float, t1: float, seqs: int, tokens: int, waiting: int) -> None:
        """Append one step (convenience; the recorder appends in blocks)."""
        self.add_steps(*(np.array([x], dtype=np.float64) for x in (t0, t1, seqs, tokens, waiting)))

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first, with time-weighted means per row.

        Columns: ``t_start``, ``t_end``, ``num_steps``, ``busy`` (seconds of
        steps in the row), and ``batch_size``, ``num_tokens``, ``num_waiting``:
        means over the row's busy time.
        """
        agg = self._agg
        busy = agg["busy"]
        safe = np.where(busy > 0, busy, 1.0)
        return {
            "t_start": agg["t_start"],
            "t_end": agg["t_end"],
            "num_steps": agg["num_steps"].astype(np.int64),
            "busy": busy,
            "batch_size": agg["seqs_dt"] / safe,
            "num_tokens": agg["tokens_dt"] / safe,
            "num_waiting": agg["waiting_dt"] / safe,
        }


def _merge_pairs(agg: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = len(agg["t_start"])
    even = n - n % 2
    out: dict[str, np.ndarray] = {}
    for f, a in agg.items():
        head = a[:even].reshape(-1, 2)
        if f == "t_start":
            merged = head[:, 0]
        elif f == "t_end":
            merged = head[:, 1]
        else:
            merged = head.sum(axis=1)
        out[f] = np.concatenate([merged, a[even:]])
    return out
