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

import struct

import numpy as np

from orcasim.metrics.series import BinnedSeries, expand_runs

VALUES = ("tokens", "allocated", "internal", "padding", "free", "stranded", "swapped")
#: raw steps held before they are binned (whole blocks of this many at a time)
BUFFER = 4096
_BUFFER = BUFFER
#: a run's row of whole numbers: its length, the tokens of its first step and their growth
#: per step, its padding and swapped slots, whether free memory was stranded (0 or 1), and
#: the slots its steps' allocated values count in (1: slots; a paged pool's block size: blocks)
#: (its start is kept apart: whole numbers packed as int64 cost a half to a third of doubles)
_RUN_FIELDS = 7


def float_array(values: list[float], code: str = "d") -> np.ndarray:
    """``np.array(values, dtype=np.float64)`` for a list of Python numbers, through their
    packed bytes: the same doubles, at a third of the cost of numpy's per-item conversion.
    ``code`` ``"q"``: the values are integers, packed as such (then converted, rounded to
    nearest as numpy rounds an integer; one beyond 64 bits goes numpy's way). The format is
    compiled here, not kept in the struct module's shared cache."""
    if code == "q":
        try:
            packed = struct.Struct(f"{len(values)}q").pack(*values)
        except struct.error:
            return np.array(values, dtype=np.float64)
        return np.frombuffer(packed, dtype=np.int64).astype(np.float64)
    return np.frombuffer(struct.Struct(f"{len(values)}d").pack(*values),
                         dtype=np.float64).copy()


class KVSeries(BinnedSeries):
    """Per-step KV memory rows (token slots), bounded to ``capacity`` rows by merging pairs."""

    def __init__(self, capacity: int = 4096, total: int = 0) -> None:
        super().__init__(VALUES, capacity)
        #: slots of the whole pool (free = total - allocated)
        self.total = total
        # raw steps not yet binned: per step its end, allocated (in its run's unit) and
        # internal slots; per run of steps (a single step is a run of one) its start, and a
        # row of _RUN_FIELDS, one after another in one list (integers below 2**53 are exact
        # in float64). Lists, not arrays: a run extends them without converting each value
        # (numpy converts a block at a flush)
        self._t1: list[float] = []
        self._alloc: list[int] = []
        self._int: list[int] = []
        self._t0: list[float] = []
        self._runs: list[int] = []

    def __len__(self) -> int:
        """Raw steps not yet binned."""
        return len(self._t1)

    def add(self, t_start: float, t_end: float, tokens: int, allocated: int, internal: int,
            padding: int, swapped: int, blocked: bool) -> None:
        """One step's memory state (``blocked``: free memory was stranded this step)."""
        t1 = self._t1
        t1.append(t_end)
        self._alloc.append(allocated)
        self._int.append(internal)
        self._t0.append(t_start)
        self._runs.extend((1, tokens, 0, padding, swapped, blocked, 1))  # a run of one
        if len(t1) >= _BUFFER:
            self.flush(whole=True)

    def add_run(self, t_start: float, ends: list[float], tokens: int, size: int,
                allocated: list[int], internal: list[int], padding: int, swapped: int,
                blocked: bool) -> None:
        """Steps back to back from ``t_start``, ending at ``ends``: :meth:`add` once per step,
        with ``tokens`` growing by ``size`` per step and ``allocated``/``internal`` per step."""
        t1 = self._t1
        t1 += ends
        self._alloc += allocated
        self._int += internal
        self._t0.append(t_start)
        self._runs.extend((len(ends), tokens, size, padding, swapped, blocked, 1))
        if len(t1) >= _BUFFER:
            self.flush(whole=True)

    def flush(self, whole: bool = False) -> None:
        """Turn the raw rows into binned columns (free and stranded computed here).

        With ``whole``, only whole blocks of the buffer's size, the rest staying
        raw: the bins then sum the same rows in the same order however the
        steps were added (one by one or in runs).
        """
        m = len(self._t1)
        n = m - m % _BUFFER if whole else m
        if not n:
            return
        if len(self._runs) != _RUN_FIELDS * len(self._t0):  # (a writer of an older row)
            raise ValueError(f"the memory series holds {len(self._runs)} run fields for "
                             f"{len(self._t0)} runs; each run has {_RUN_FIELDS}")
        t1 = float_array(self._t1)
        alloc = float_array(self._alloc, "q")
        internal = float_array(self._int, "q")
        starts = float_array(self._t0)
        runs = float_array(self._runs, "q").reshape(-1, _RUN_FIELDS)
        k, first, t0 = expand_runs(t1, runs[:, 0], starts)
        alloc *= np.repeat(runs[:, 6], k)  # slots (exact: whole numbers below 2**53)
        tok0, size, pad, swap, blk = (np.repeat(runs[:, i], k) for i in range(1, 6))
        since = np.arange(m) - np.repeat(first, k)  # steps since the run's first
        tok = tok0 + size * since  # exact: integers in float64
        if n < m:  # the steps from n on stay raw; the run they start in is cut there
            r = int(np.searchsorted(first, n, side="right")) - 1
            rest = runs[r:].copy()
            rest[0, 0] -= n - int(first[r])  # the steps of run r before n
            rest[0, 1] = tok[n]
            rest_starts = starts[r:].copy()
            rest_starts[0] = t0[n]
            tails = (t1[n:].tolist(), self._alloc[n:], self._int[n:], rest_starts.tolist())
        for c in (self._t1, self._alloc, self._int, self._t0, self._runs):
            del c[:]
        if n < m:
            for c, tail in zip((self._t1, self._alloc, self._int, self._t0), tails, strict=True):
                c.extend(tail)
            self._runs += rest.astype(np.int64).ravel().tolist()  # (whole numbers)
        free = self.total - alloc[:n]
        stranded = np.where(blk[:n] > 0, free, 0.0)
        self.add_columns(t0[:n], t1[:n], [tok[:n], alloc[:n], internal[:n], pad[:n], free,
                                          stranded, swap[:n]])

    def totals(self) -> dict[str, float]:
        """Sums over the run: ``busy`` seconds and each ``<value>_dt`` integral."""
        self.flush()
        return super().totals()

    def rows(self) -> dict[str, np.ndarray]:
        """All rows, oldest first: span, steps, busy time and time-weighted mean slots per row."""
        self.flush()
        return super().rows()
