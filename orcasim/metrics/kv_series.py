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

    def __init__(self, capacity: int = 4096) -> None:
        super().__init__(VALUES, capacity)
        self._buf: list[tuple[float, ...]] = []

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
        self.add_columns(a[:, 0], a[:, 1], [a[:, 2 + i] for i in range(len(VALUES))])

    def totals(self) -> dict[str, float]:
        """Sums over the run: ``busy`` seconds and each ``<value>_dt`` integral."""
        self._flush()
        return super().totals()

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first: span, steps, busy time and time-weighted mean slots per row."""
        self._flush()
        return super().rows()
