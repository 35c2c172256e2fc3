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

from itertools import repeat

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
            self.flush(whole=True)

    def add_run(self, t_start: float, ends: list[float], tokens: int, size: int,
                allocated: list[int], internal: list[int], padding: int, swapped: int,
                blocked: bool) -> None:
        """Steps back to back from ``t_start``, ending at ``ends``: :meth:`add` once per step,
        with ``tokens`` growing by ``size`` per step and ``allocated``/``internal`` per step."""
        buf = self.buf
        k = len(ends)
        starts = [t_start, *ends[:-1]]
        buf.extend(zip(starts, ends, range(tokens, tokens + size * k, size) if size else
                       repeat(tokens, k), allocated, internal, repeat(padding, k),
                       repeat(swapped, k), repeat(blocked, k), strict=True))
        if len(buf) >= _BUFFER:
            self.flush(whole=True)

    def flush(self, whole: bool = False) -> None:
        """Turn the raw rows into binned columns (free and stranded computed here).

        With ``whole``, only whole blocks of the buffer's size, the rest staying
        raw: the bins then sum the same rows in the same order however the
        steps were added (one by one or in runs).
        """
        buf = self.buf
        n = len(buf) - len(buf) % _BUFFER if whole else len(buf)
        if not n:
            return
        a = np.array(buf[:n], dtype=np.float64)
        self.buf = buf[n:]
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
