"""The recorder: plain columns appended in the hot path, turned into arrays at the end.

Per request it keeps one row, written when the request reaches its final
state (:class:`~orcasim.metrics.request_rows.RequestRows`). Per step it
keeps (a) the inter-token gap of the step and how many tokens had it, which
is all that exact ITL percentiles need, and (b) a bounded, time-binned
series of batch size, tokens and queue length for plots. The full per-step
batch listing is kept only when asked for (``trace_steps``).
"""

from __future__ import annotations

from array import array

import numpy as np

from orcasim.metrics.kv_series import KVSeries
from orcasim.metrics.request_rows import RequestRows
from orcasim.metrics.series import StepSeries, expand_runs

#: steps per block when the gaps are computed in place from the step ends
GAP_BLOCK = 1 << 20
#: flushed blocks of steps merged into one array (of about a million steps)
MERGE_BLOCKS = 256


class Recorder(RequestRows):
    """Collects a run's per-request rows, ITL samples and step series."""

    def __init__(self, trace_steps: bool = False, series_capacity: int = 4096,
                 spill_rows: int | None = None, expected_rows: int = 0) -> None:
        super().__init__(spill_rows, expected_rows)
        self.num_arrived = 0
        self._steps_flushed = 0
        self._sum_batch = 0
        self._steps_taken = False  # step ends handed over by itl_samples(take=True)
        # per step, kept for the whole run (12 bytes a step): its end and its ITL token count;
        # a step's gap is its end minus the previous step's end (0 before the first)
        self._step_end: list[np.ndarray] = []
        self._itl_count: list[np.ndarray] = []
        self._steps_merged = 0  # leading entries of those lists that are merged blocks
        self._extra_itl: list[tuple[float, int, int]] = []
        #: entries of _extra_itl that stand for this many equal samples (record_itl_each)
        self._extra_times: dict[int, int] = {}
        # steps not yet flushed: per step its end and queue length; per run of steps with one
        # batch (a single step is a run of one) its start, and its length, batch size, and
        # tokens and ITL count of its first and later steps (appended column by column: the
        # cheapest way from Python numbers to arrays)
        self._t1 = array("d")
        self._waiting = array("q")
        self._r_start = array("d")
        self._r_ints = tuple(array("q") for _ in range(6))  # length, seqs, tokens, count
        self._r_appends = (self._r_start.append, *(a.append for a in self._r_ints))
        self._buf_cap = max(16, series_capacity)
        self.series = StepSeries(series_capacity)
        # steps flushed but not yet in the series: it takes them in blocks of _buf_cap steps,
        # so its bins sum the same floats in the same order however the steps were recorded
        self._series_rest: list[np.ndarray] | None = None
        self.trace_steps = trace_steps
        self.kv: KVSeries | None = None  # KV memory use per step, when the run models memory
        self.steps: list[tuple[int, float, float, tuple[str | None, ...]]] = []

    #: whether :meth:`record_step` keeps anything (a recorder that ignores steps says not, and
    #: the engine then leaves out the call)
    records_steps = True

    def record_step(
        self,
        t_start: float,
        t_end: float,
        num_seqs: int,
        num_tokens: int,
        num_waiting: int,
        itl_count: int,
    ) -> None:
        """One step: its span, batch and queue, and ``itl_count`` tokens emitted with the step's
        inter-token gap (its end minus the previous step's end)."""
        self._t1.append(t_end)
        self._waiting.append(num_waiting)
        start, length, seqs, tokens, tokens_rest, count, count_rest = self._r_appends
        start(t_start)
        length(1)
        seqs(num_seqs)
        tokens(num_tokens)
        tokens_rest(num_tokens)
        count(itl_count)
        count_rest(itl_count)
        if len(self._t1) >= self._buf_cap:
            self._flush()

    def record_run(
        self,
        t_start: float,
        ends: list[float],
        num_seqs: int,
        num_tokens: tuple[int, int],
        num_waiting: list[int],
        itl_count: tuple[int, int],
    ) -> None:
        """A run of steps back to back from ``t_start``, ending at ``ends``, with one batch.

        ``num_tokens`` and ``itl_count`` are ``(first step, every later step)``;
        ``num_waiting`` holds the queue length at the start of each step.
        The same rows as :meth:`record_step` once per step.
        """
        t1 = self._t1
        t1.fromlist(ends)  # (from a list: twice as fast as extend)
        self._waiting.fromlist(num_waiting)
        start, length, seqs, tokens, tokens_rest, count, count_rest = self._r_appends
        start(t_start)
        length(len(ends))
        seqs(num_seqs)
        tokens(num_tokens[0])
        tokens_rest(num_tokens[1])
        count(itl_count[0])
        count_rest(itl_count[1])
        if len(t1) >= self._buf_cap:
            self._flush()

    def record_decode_runs(self, runs: list[tuple[float, int, int, int]]) -> None:
        """Runs of decode steps whose ends and queue lengths are in the step columns already
        (appended as :meth:`record_run` appends them): ``(start, steps, batch size, ITL
        tokens of the first step)`` each, every step computing a token per sequence and
        every later step's tokens all inter-token gaps. The same rows as
        :meth:`record_run`, a block of runs at a time."""
        r_len, r_seqs, r_tokens, r_tokens_rest, r_count, r_count_rest = self._r_ints
        self._r_start.fromlist([r[0] for r in runs])
        r_len.fromlist([r[1] for r in runs])
        sizes = [r[2] for r in runs]
        r_seqs.fromlist(sizes)
        r_tokens.fromlist(sizes)
        r_tokens_rest.fromlist(sizes)
        r_count.fromlist([r[3] for r in runs])
        r_count_rest.fromlist(sizes)

    def _flush(self) -> None:
        if not self._t1:
            return
        t1 = np.array(self._t1, dtype=np.float64)
        waiting = np.frombuffer(self._waiting, dtype=np.int64).astype(np.float64)
        # copies, not views: the buffers are emptied below, which a view would forbid
        r_len, r_seqs, r_tokens, r_tokens_rest, r_count, r_count_rest = [
            np.frombuffer(a, dtype=np.int64).copy() for a in self._r_ints]
        k, first, t0 = expand_runs(t1, r_len, np.array(self._r_start, dtype=np.float64))
        seqs = np.repeat(r_seqs, k)
        tokens = np.repeat(r_tokens_rest.astype(np.float64), k)
        tokens[first] = r_tokens
        count = np.repeat(r_count_rest.astype(np.int32), k)
        count[first] = r_count
        for col in (self._t1, self._waiting, self._r_start, *self._r_ints):
            del col[:]
        self._steps_flushed += len(t1)
        self._sum_batch += int(seqs.sum())
        self._step_end.append(t1)
        self._itl_count.append(count)
        if len(self._step_end) >= self._steps_merged + MERGE_BLOCKS:
            self._merge_steps()
        self._to_series([t0, t1, seqs.astype(np.float64), tokens, waiting])

    def _merge_steps(self) -> None:
        """Merge the step blocks flushed since the last merge into one array.

        Flushed blocks are small (``_buf_cap`` steps) and come from the C heap, which
        keeps freed memory; merged ones are large enough to be returned to the system
        when they are let go, so handing the steps over does not leave them resident.
        """
        k = self._steps_merged
        for col in (self._step_end, self._itl_count):
            col[k:] = [np.concatenate(col[k:])]
        self._steps_merged = k + 1

    def _to_series(self, cols: list[np.ndarray], everything: bool = False) -> None:
        """Give the series whole blocks of ``_buf_cap`` steps (with ``everything``, the rest
        too), keeping the rest for the next call: step by step or in runs, the same blocks."""
        rest = self._series_rest
        if rest is not None:
            cols = [np.concatenate([a, b]) for a, b in zip(rest, cols, strict=True)]
        n = len(cols[0])
        cut = n if everything else n - n % self._buf_cap
        self._series_rest = [c[cut:] for c in cols] if cut < n else None
        if cut:
            self.series.add_steps(*(c[:cut] for c in cols))

    @property
    def num_steps(self) -> int:
        """Steps recorded so far."""
        return self._steps_flushed + len(self._t1)

    @property
    def sum_batch(self) -> int:
        """Sequence-steps so far: the sum of the batch size over steps."""
        self._flush()
        return self._sum_batch

    def record_itl(self, gap: float, count: int = 1) -> None:
        """Inter-token gaps outside the step rule (e.g. the first token after a resume).

        Called while a step completes, so the gap belongs to the step recorded next.
        """
        self._extra_itl.append((gap, count, self.num_steps))

    def record_itl_each(self, gap: float, times: int) -> None:
        """``times`` separate one-token samples of ``gap``: ``record_itl(gap)`` ``times`` times,
        in one call (the requests of a step that all waited since the same token)."""
        if times > 0:  # one entry, repeated when the samples are read (_extra_columns)
            extra = self._extra_itl
            extra.append((gap, 1, self.num_steps))
            if times > 1:
                self._extra_times[len(extra) - 1] = times

    def _extra_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The :meth:`record_itl` samples as columns: gaps, counts and step numbers, one row
        per sample (an entry of :meth:`record_itl_each` repeated)."""
        extra = self._extra_itl
        gaps = np.array([g for g, _, _ in extra], dtype=np.float64)
        counts = np.array([c for _, c, _ in extra], dtype=np.int64)
        steps = np.array([k for _, _, k in extra], dtype=np.int64)
        if self._extra_times:
            times = np.ones(len(extra), dtype=np.int64)
            times[list(self._extra_times)] = list(self._extra_times.values())
            gaps, counts, steps = (np.repeat(a, times) for a in (gaps, counts, steps))
        return gaps, counts, steps

    def record_batch(self, t_start: float, t_end: float, labels: tuple[str | None, ...]) -> None:
        """Per-step batch listing (only when ``trace_steps``); ``None`` is an empty slot."""
        self.steps.append((self.num_steps, t_start, t_end, labels))

    # -- end of run ---------------------------------------------------------
    def _steps(self, take: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Every step's end and ITL token count (flushed first); with ``take`` the recorder
        lets go of each block of steps once copied."""
        self._flush()
        if not take:
            ends = np.concatenate([np.zeros(0), *self._step_end])
            counts = np.concatenate([np.zeros(0, np.int32), *self._itl_count])
            return ends, counts
        chunks = list(zip(self._step_end, self._itl_count, strict=True))
        self._step_end, self._itl_count = [], []
        self._steps_merged = 0
        self._steps_taken = True
        chunks.reverse()
        ends = np.empty(self._steps_flushed)
        counts = np.empty(self._steps_flushed, dtype=np.int32)
        at = 0
        while chunks:
            e, c = chunks.pop()
            ends[at:at + e.size] = e
            counts[at:at + e.size] = c
            at += e.size
        return ends, counts

    def itl_samples(self, take: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Inter-token gaps as ``(gaps, counts)``: each gap occurred ``count`` times.

        With ``take`` the recorder lets go of its per-step ends and counts
        (:meth:`itl_times` then knows no steps): at the run's end they are
        held once, as the gaps.
        """
        ends, counts = self._steps(take)
        gaps = ends  # each step's end minus the previous one's (0 before the first), in place,
        block = GAP_BLOCK  # a block at a time from the end: the ends below it are still whole
        for hi in range(gaps.size, 1, -block):
            lo = max(hi - block, 1)
            gaps[lo:hi] -= ends[lo - 1:hi - 1]
        keep = counts > 0
        if not keep.all():  # steps without ITL tokens out, in place, a block at a time
            kept = 0
            for lo in range(0, gaps.size, block):
                k = keep[lo:lo + block]
                g, c = gaps[lo:lo + block][k], counts[lo:lo + block][k]
                gaps[kept:kept + g.size] = g
                counts[kept:kept + g.size] = c
                kept += g.size
            gaps, counts = gaps[:kept], counts[:kept]
        del keep
        if not self._extra_itl:  # the counts stay 32-bit (a step emits < 2**31 tokens)
            return gaps, counts
        extra_gaps, extra_counts, _ = self._extra_columns()
        return np.concatenate([gaps, extra_gaps]), np.concatenate([counts, extra_counts])

    def itl_times(self) -> np.ndarray:
        """End time of the step each :meth:`itl_samples` entry belongs to (same order)."""
        if self._steps_taken:
            raise ValueError("the steps were handed over by itl_samples(take=True): "
                             "ask for itl_times() before")
        ends, counts = self._steps()
        idx = self._extra_columns()[2]
        extra = ends[np.minimum(idx, ends.size - 1)] if idx.size else np.zeros(0)
        return np.concatenate([ends[counts > 0], extra])

    def series_rows(self) -> dict[str, np.ndarray]:
        """The bounded per-step series (see :class:`StepSeries`)."""
        self._flush()
        if self._series_rest is not None:
            self._to_series([np.zeros(0)] * 5, everything=True)
        return self.series.rows()
