"""A bounded per-step time series: exact for short runs, time-binned for long ones.

Steps arrive in blocks of raw rows. Every row holds ``width`` consecutive
steps (the last one possibly fewer); when there would be more than
``capacity`` rows, the width doubles and adjacent rows merge in pairs, so
memory stays under ``capacity`` rows whatever the run length and all bins
cover the same number of steps, old and new. A merged row keeps its time
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
        self.width = 1  # steps per row
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
        self._agg, self.width = rebin(agg, self.width, self.capacity)

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


def rebin(
    agg: dict[str, np.ndarray], width: int, capacity: int
) -> tuple[dict[str, np.ndarray], int]:
    """Group rows into bins of ``width`` steps, doubling ``width`` until at most ``capacity``.

    Rows hold ``num_steps`` consecutive steps, aligned to multiples of their
    size (raw steps, or bins of a previous width), so grouping by the index
    of a row's first step merges them exactly. Returns the rows and the width.
    """
    while True:
        steps = agg["num_steps"]
        first = np.concatenate([[0.0], np.cumsum(steps)[:-1]])
        group = (first // width).astype(np.int64)
        if len(group) and group[-1] + 1 <= capacity:
            break
        if not len(group):
            return agg, width
        width *= 2
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    if len(starts) == len(group):
        return agg, width
    ends = np.concatenate([starts[1:], [len(group)]]) - 1
    out: dict[str, np.ndarray] = {}
    for f, a in agg.items():
        if f == "t_start":
            out[f] = a[starts]
        elif f == "t_end":
            out[f] = a[ends]
        else:
            out[f] = np.add.reduceat(a, starts)
    return out, width
