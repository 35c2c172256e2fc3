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

from orcasim.metrics.group_sums import group_sums


def expand_runs(t1: np.ndarray, run_len: object, run_start: object
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps stored as runs: ``(k, first, t0)``.

    ``t1`` holds every step's end; ``run_len`` and ``run_start`` each run's
    step count and start. ``k`` is the run lengths, ``first`` each run's first
    step, ``t0`` every step's start (where the step before it in its run
    ended, or the run's start).
    """
    k = np.array(run_len, dtype=np.int64)
    first = np.cumsum(k) - k
    t0 = np.empty_like(t1)
    t0[1:] = t1[:-1]
    t0[first] = run_start
    return k, first, t0


class BinnedSeries:
    """Rows of consecutive steps holding time integrals of named per-step values.

    Each row keeps its span (``t_start``, ``t_end``), ``num_steps``, ``busy``
    (seconds of steps) and ``<value>_dt`` (the value times step duration,
    summed), merged by :func:`rebin` to stay within ``capacity`` rows.
    """

    def __init__(self, values: tuple[str, ...], capacity: int = 4096) -> None:
        if capacity < 2:
            raise ValueError('"capacity" must be >= 2.')
        self.values = values
        self.capacity = capacity
        self.width = 1  # steps per row
        self._fields = ("t_start", "t_end", "num_steps", "busy", *(f"{v}_dt" for v in values))
        self._agg: dict[str, np.ndarray] = {f: np.zeros(0) for f in self._fields}

    def add_columns(self, t0: np.ndarray, t1: np.ndarray, columns: list[np.ndarray]) -> None:
        """Append raw steps: their start and end times and one column per value, in order."""
        old = self._agg
        n = len(old["num_steps"])
        width = self.width
        done = int(old["num_steps"].sum())  # steps in the rows so far
        if n and width > 1 and (done + len(t0) - 1) // width < self.capacity:
            self._merge_tail(t0, t1, columns, done)
            return
        dt = t1 - t0
        raw = {"t_start": t0, "t_end": t1, "num_steps": np.ones_like(t0), "busy": dt}
        for v, col in zip(self.values, columns, strict=True):
            raw[f"{v}_dt"] = col * dt
        agg = {f: np.concatenate([old[f], raw[f]]) for f in self._fields}
        self._agg, self.width = rebin(agg, width, self.capacity)

    def _merge_tail(self, t0: np.ndarray, t1: np.ndarray, columns: list[np.ndarray],
                    done: int) -> None:
        """:meth:`add_columns` while the width stays: only a partial last row can take in new
        steps, so the rows from it on merge (the same sums, over the same rows, as
        :func:`rebin` over them all). The new steps' bins are known from ``done`` (steps so
        far): the partial row's takes the first ones, then every ``width`` steps start one."""
        old = self._agg
        width = self.width
        m = len(t0)
        if not m:
            return
        part = done % width  # steps in the last row, when it is partial
        p = 1 if part else 0
        keep = len(old["num_steps"]) - p
        summed = self._fields[2:]  # (t_start, t_end first)
        # the summed fields of the partial row and the new steps, side by side
        rows = np.empty((p + m, len(summed)))
        if p:
            rows[0] = [old[f][-1] for f in summed]
        rows[p:, 0] = 1.0
        dt = np.subtract(t1, t0, out=rows[p:, 1])
        for j, col in enumerate(columns, 2):
            np.multiply(col, dt, out=rows[p:, j])
        # bin starts among those rows; the partial row's bin takes width - part new steps
        starts = np.arange(p + (width - part) % width, p + m, width)
        if p:
            starts = np.concatenate([[0], starts])
        sums = group_sums(rows, starts)
        raw_starts = starts - p  # where each new bin's first new step is (-1: the partial row)
        raw_ends = np.append(starts[1:], p + m) - 1 - p
        t_start = t0[raw_starts]
        if p:
            t_start[0] = old["t_start"][-1]
        new = {"t_start": t_start, "t_end": t1[raw_ends]}
        for j, f in enumerate(summed):
            new[f] = sums[:, j]
        self._agg = {f: np.concatenate([old[f][:keep], new[f]]) for f in self._fields}

    def totals(self) -> dict[str, float]:
        """Sums over the run: ``num_steps``, ``busy`` seconds and each ``<value>_dt`` integral."""
        return {f: float(a.sum()) for f, a in self._agg.items() if f not in ("t_start", "t_end")}

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first: span, steps, busy time and each value's mean over busy time."""
        agg = self._agg
        busy = agg["busy"]
        safe = np.where(busy > 0, busy, 1.0)
        out = {
            "t_start": agg["t_start"],
            "t_end": agg["t_end"],
            "num_steps": agg["num_steps"].astype(np.int64),
            "busy": busy,
        }
        for v in self.values:
            out[v] = agg[f"{v}_dt"] / safe
        return out


class StepSeries(BinnedSeries):
    """Per-step batch size, tokens and queue length, merged to stay bounded.

    :meth:`rows` gives ``batch_size``, ``num_tokens`` and ``num_waiting`` as
    means over each row's busy time.
    """

    def __init__(self, capacity: int = 4096) -> None:
        super().__init__(("batch_size", "num_tokens", "num_waiting"), capacity)

    def add_steps(self, t0: np.ndarray, t1: np.ndarray, seqs: np.ndarray, tokens: np.ndarray,
                  waiting: np.ndarray) -> None:
        """Append raw steps (one array element per step), then merge rows to stay bounded."""
        self.add_columns(t0, t1, [seqs, tokens, waiting])

    def add(self, t0: float, t1: float, seqs: int, tokens: int, waiting: int) -> None:
        """Append one step (convenience; the recorder appends in blocks)."""
        self.add_steps(*(np.array([x], dtype=np.float64) for x in (t0, t1, seqs, tokens, waiting)))


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
        group = first.astype(np.int64) // width  # (whole numbers of steps)
        if len(group) and group[-1] + 1 <= capacity:
            break
        if not len(group):
            return agg, width
        width *= 2
    return merge_rows(agg, width, 0, group), width


def merge_rows(agg: dict[str, np.ndarray], width: int, first: int,
               group: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Merge rows that fall into the same bin of ``width`` steps, the first row starting at
    step ``first`` (``group``: each row's bin, when known)."""
    if group is None:
        steps = agg["num_steps"]
        start = np.concatenate([[0.0], np.cumsum(steps)[:-1]]) + first
        group = start.astype(np.int64) // width
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    if len(starts) == len(group):
        return agg
    ends = np.concatenate([starts[1:], [len(group)]]) - 1
    summed = [f for f in agg if f not in ("t_start", "t_end")]
    # the summed fields side by side: one pass over the bins for all of them (group_sums:
    # reduceat's floats)
    sums = group_sums(np.stack([agg[f] for f in summed], axis=1), starts)
    out: dict[str, np.ndarray] = {}
    for f, a in agg.items():
        if f == "t_start":
            out[f] = a[starts]
        elif f == "t_end":
            out[f] = a[ends]
        else:
            out[f] = sums[:, summed.index(f)].copy()
    return out
