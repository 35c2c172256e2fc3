"""A bounded time series of KV memory use, one raw row per step, merged like the step series.

Each step contributes the KV slots holding tokens, allocated, allocated but
never to be filled (internal fragmentation), allocated as an allocator's
rounding (padding), free, free but stranded (a request waited for memory)
and swapped to the CPU. Padding and stranded slots are external fragmentation.
Rows are kept as time integrals (value x step duration) in bins of equal
numbers of steps, merged like :class:`~orcasim.metrics.series.StepSeries`,
so time-weighted means stay exact per bin and the run's totals exact.
"""

from __future__ import annotations

import numpy as np

from orcasim.metrics.series import rebin

VALUES = ("tokens", "allocated", "internal", "padding", "free", "stranded", "swapped")
_FIELDS = ("t_start", "t_end", "num_steps", "busy", *(f"{v}_dt" for v in VALUES))
_BUFFER = 4096


class KVSeries:
    """Per-step KV memory rows (token slots), bounded to ``capacity`` rows by merging pairs."""

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 2:
            raise ValueError('"capacity" must be >= 2.')
        self.capacity = capacity
        self.width = 1  # steps per row
        self._buf: list[tuple[float, ...]] = []
        self._agg: dict[str, np.ndarray] = {f: np.zeros(0) for f in _FIELDS}

    def add(self, t_start: float, t_end: float, tokens: int, allocated: int, internal: int,
            padding: int, free: int, stranded: int, swapped: int) -> None:
        """One step's memory state (hot path: appends a tuple)."""
        buf = self._buf
        buf.append((t_start, t_end, tokens, allocated, internal, padding, free, stranded,
                    swapped))
        if len(buf) >= _BUFFER:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        a = np.array(self._buf, dtype=np.float64)
        self._buf = []
        dt = a[:, 1] - a[:, 0]
        raw = {"t_start": a[:, 0], "t_end": a[:, 1], "num_steps": np.ones(len(a)), "busy": dt}
        for i, v in enumerate(VALUES):
            raw[f"{v}_dt"] = a[:, 2 + i] * dt
        agg = {f: np.concatenate([self._agg[f], raw[f]]) for f in _FIELDS}
        self._agg, self.width = rebin(agg, self.width, self.capacity)

    def totals(self) -> dict[str, float]:
        """Sums over the run: ``busy`` seconds and each ``<value>_dt`` integral."""
        self._flush()
        return {f: float(a.sum()) for f, a in self._agg.items() if f not in ("t_start", "t_end")}

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first: span, steps, busy time and time-weighted mean slots per row."""
        self._flush()
        agg = self._agg
        busy = agg["busy"]
        safe = np.where(busy > 0, busy, 1.0)
        out = {
            "t_start": agg["t_start"],
            "t_end": agg["t_end"],
            "num_steps": agg["num_steps"].astype(np.int64),
            "busy": busy,
        }
        for v in VALUES:
            out[v] = agg[f"{v}_dt"] / safe
        return out
