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

from orcasim.metrics.series import BinnedSeries

VALUES = ("tokens", "allocated", "internal", "padding", "free", "stranded", "swapped")
_BUFFER = 4096


class KVSeries(BinnedSeries):
    """Per-step KV memory rows (token slots), bounded to ``capacity`` rows by merging pairs."""

    def __init__(self, capacity: int = 4096, total: int = 0) -> None:
        super().__init__(VALUES, capacity)
        #: slots of the whole pool (free = total - allocated)
        self.total = total
        #: raw rows ``(t_start, t_end, tokens, allocated, internal, padding, swapped, blocked)``
        self.buf: list[tuple[float, ...]] = []

    def add(self, t_start: float, t_end: float, tokens: int, allocated: int, internal: int,
            padding: int, swapped: int, blocked: bool) -> None:
        """One step's memory state (``blocked``: free memory was stranded this step)."""
        buf = self.buf
        buf.append((t_start, t_end, tokens, allocated, internal, padding, swapped, blocked))
        if len(buf) >= _BUFFER:
            self.flush()

    def add_rows(self, rows: list[tuple[float, ...]]) -> None:
        """Several raw rows at once, as :meth:`add` takes them, oldest first."""
        buf = self.buf
        buf.extend(rows)
        if len(buf) >= _BUFFER:
            self.flush()

    def flush(self) -> None:
        """Turn the raw rows into binned columns (free and stranded computed here)."""
        if not self.buf:
            return
        a = np.array(self.buf, dtype=np.float64)
        self.buf = []
        free = self.total - a[:, 3]
        stranded = np.where(a[:, 7] > 0, free, 0.0)
        cols = [a[:, 2], a[:, 3], a[:, 4], a[:, 5], free, stranded, a[:, 6]]
        self.add_columns(a[:, 0], a[:, 1], cols)

    def totals(self) -> dict[str, float]:
        """Sums over the run: ``busy`` seconds and each ``<value>_dt`` integral."""
        self.flush()
        return super().totals()

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first: span, steps, busy time and time-weighted mean slots per row."""
        self.flush()
        return super().rows()
