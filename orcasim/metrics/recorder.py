"""The recorder: plain columns appended in the hot path, turned into arrays at the end.

Per request it keeps one row, written when the request reaches its final
state. Per step it keeps (a) the inter-token gap of the step and how many
tokens had it, which is all that exact ITL percentiles need, and (b) a
bounded, time-binned series of batch size, tokens and queue length for plots.
The full per-step batch listing is kept only when asked for (``trace_steps``).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import numpy as np

from orcasim.metrics.kv_series import KVSeries
from orcasim.metrics.row_spill import RowSpill, SpilledColumns
from orcasim.metrics.series import StepSeries, expand_runs
from orcasim.request import FINAL_STATES, Request, RequestState

_NAN = float("nan")
#: steps per block when the gaps are computed in place from the step ends
GAP_BLOCK = 1 << 20
#: flushed blocks of steps merged into one array (of about a million steps)
MERGE_BLOCKS = 256

REQUEST_FLOAT_COLUMNS = ("arrival", "first_scheduled", "first_token", "finish")
REQUEST_INT_COLUMNS = (
    "id",
    "prompt_len",
    "output_len",
    "num_output_tokens",
    "num_preemptions",
    "priority",
    "state",
)


class Recorder:
    """Collects a run's per-request rows, ITL samples and step series."""

    def __init__(self, trace_steps: bool = False, series_capacity: int = 4096,
                 spill_rows: int | None = None, expected_rows: int = 0) -> None:
        self.num_arrived = 0
        # with spill_rows: every block of that many rows goes to a RowSpill (on disk, in id
        # order) as it fills; see orcasim.metrics.row_spill
        self._spill_at = spill_rows or sys.maxsize
        self._expected_rows = expected_rows  # how many rows the spill makes room for
        self._spill: RowSpill | None = None
        self._steps_flushed = 0
        self._sum_batch = 0
        self._taken = 0  # rows handed over by request_columns(take=True)
        self._steps_taken = False  # step ends handed over by itl_samples(take=True)
        self._f = {c: array("d") for c in REQUEST_FLOAT_COLUMNS}
        self._i = {c: array("q") for c in REQUEST_INT_COLUMNS}
        # string columns, sparse (row -> value; most are None)
        self._name: dict[int, str] = {}
        self._tenant: dict[int, str] = {}
        self._cls: dict[int, str] = {}
        self._reason: dict[int, str] = {}
        self._bind_appends()
        # per step, kept for the whole run (12 bytes a step): its end and its ITL token count;
        # a step's gap is its end minus the previous step's end (0 before the first)
        self._step_end: list[np.ndarray] = []
        self._itl_count: list[np.ndarray] = []
        self._steps_merged = 0  # leading entries of those lists that are merged blocks
        self._extra_itl: list[tuple[float, int, int]] = []
        # steps not yet flushed: per step its end and queue length; per run of steps with one
        # batch (a single step is a run of one) its start, length, batch size, and tokens and
        # ITL count of its first and later steps
        self._t1 = array("d")
        self._waiting = array("q")
        self._r_start = array("d")
        self._r_len = array("q")
        self._r_seqs = array("q")
        self._r_tokens = array("q")
        self._r_tokens_rest = array("q")
        self._r_count = array("q")
        self._r_count_rest = array("q")
        self._buf_cap = max(16, series_capacity)
        self.series = StepSeries(series_capacity)
        # steps flushed but not yet in the series: it takes them in blocks of _buf_cap steps,
        # so its bins sum the same floats in the same order however the steps were recorded
        self._series_rest: list[np.ndarray] | None = None
        self.trace_steps = trace_steps
        self.kv: KVSeries | None = None  # KV memory use per step, when the run models memory
        self.steps: list[tuple[int, float, float, tuple[str | None, ...]]] = []

    def _bind_appends(self) -> None:
        f, i = self._f, self._i
        self._appends: tuple = (f["arrival"].append, f["first_scheduled"].append,
                                f["first_token"].append, f["finish"].append,
                                *(i[c].append for c in REQUEST_INT_COLUMNS))

    # -- hot path -----------------------------------------------------------
    def record_request(self, req: Request) -> None:
        """Append ``req``'s final row."""
        (arrival, first_scheduled, first_token, finish, rid, prompt_len, output_len,
         num_output_tokens, num_preemptions, priority, state) = self._appends
        row = len(self._i["id"])
        arrival(req.arrival)
        first_scheduled(_NAN if req.first_scheduled is None else req.first_scheduled)
        first_token(_NAN if req.first_token is None else req.first_token)
        finish(_NAN if req.finish is None else req.finish)
        rid(req.id)
        prompt_len(req.prompt_len)
        output_len(req.output_len)
        num_output_tokens(req.num_output_tokens)
        num_preemptions(req.num_preemptions)
        priority(req.priority)
        state(req.state)
        if req.name is not None:
            self._name[row] = req.name
        if req.tenant is not None:
            self._tenant[row] = req.tenant
        if req.cls is not None:
            self._cls[row] = req.cls
        if req.reason is not None:
            self._reason[row] = req.reason
        if row + 1 >= self._spill_at:
            self._spill_block()

    def _spill_block(self) -> None:
        """Hand the rows held so far to the spill (started on the first block)."""
        if self._spill is None:
            self._spill = RowSpill(self._expected_rows)
        self._spill.add(self._take_block())

    def _take_block(self) -> dict[str, np.ndarray]:
        """The rows held, in the order recorded, as numpy columns (strings as object arrays);
        the recorder lets go of them."""
        n = len(self._i["id"])
        block: dict[str, np.ndarray] = {}
        for c, a in self._i.items():
            block[c] = np.frombuffer(a, dtype=np.int64).copy() if a else np.zeros(0, np.int64)
        for c, a in self._f.items():
            block[c] = np.frombuffer(a, dtype=np.float64).copy() if a else np.zeros(0)
        for c, sparse in (("name", self._name), ("tenant", self._tenant), ("cls", self._cls),
                          ("reason", self._reason)):
            col = np.full(n, None, dtype=object)
            for k, v in sparse.items():
                col[k] = v
            block[c] = col
            sparse.clear()
        self._f = {c: array("d") for c in REQUEST_FLOAT_COLUMNS}
        self._i = {c: array("q") for c in REQUEST_INT_COLUMNS}
        self._bind_appends()
        return block

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
        self._r_start.append(t_start)
        self._r_len.append(1)
        self._r_seqs.append(num_seqs)
        self._r_tokens.append(num_tokens)
        self._r_tokens_rest.append(num_tokens)
        self._r_count.append(itl_count)
        self._r_count_rest.append(itl_count)
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
        self._t1.extend(ends)
        self._waiting.extend(num_waiting)
        self._r_start.append(t_start)
        self._r_len.append(len(ends))
        self._r_seqs.append(num_seqs)
        self._r_tokens.append(num_tokens[0])
        self._r_tokens_rest.append(num_tokens[1])
        self._r_count.append(itl_count[0])
        self._r_count_rest.append(itl_count[1])
        if len(self._t1) >= self._buf_cap:
            self._flush()

    def _flush(self) -> None:
        if not self._t1:
            return
        t1 = np.array(self._t1, dtype=np.float64)
        waiting = np.array(self._waiting, dtype=np.float64)
        k, first, t0 = expand_runs(t1, self._r_len, self._r_start)
        seqs = np.repeat(np.array(self._r_seqs, dtype=np.int64), k)
        tokens = np.repeat(np.array(self._r_tokens_rest, dtype=np.float64), k)
        tokens[first] = self._r_tokens
        count = np.repeat(np.array(self._r_count_rest, dtype=np.int32), k)
        count[first] = self._r_count
        for col in (self._t1, self._waiting, self._r_start, self._r_len, self._r_seqs,
                    self._r_tokens, self._r_tokens_rest, self._r_count, self._r_count_rest):
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
        self._extra_itl.extend([(gap, 1, self.num_steps)] * times)

    def record_batch(self, t_start: float, t_end: float, labels: tuple[str | None, ...]) -> None:
        """Per-step batch listing (only when ``trace_steps``); ``None`` is an empty slot."""
        self.steps.append((self.num_steps, t_start, t_end, labels))

    # -- end of run ---------------------------------------------------------
    @property
    def num_recorded(self) -> int:
        spilled = self._spill.num_rows if self._spill is not None else 0
        return len(self._i["id"]) + self._taken + spilled

    def state_counts(self) -> dict[RequestState, int]:
        """Recorded requests by final state."""
        states = np.frombuffer(self._i["state"], dtype=np.int64) if self._i["state"] else \
            np.zeros(0, np.int64)
        spilled = self._spill.state_counts if self._spill is not None else None
        return {s: int((states == int(s)).sum()) + (int(spilled[s]) if spilled is not None
                                                    else 0) for s in FINAL_STATES}

    def num_distinct_ids(self) -> int:
        """Distinct request ids among the recorded rows (each request must end once)."""
        if self._spill is not None:
            return self._spill.num_distinct_ids(self._i["id"])
        return int(np.unique(np.frombuffer(self._i["id"], dtype=np.int64)).size) \
            if self._i["id"] else 0

    def request_columns(self, take: bool = False) -> dict[str, Any] | SpilledColumns:
        """Per-request columns as numpy arrays (and lists for strings), sorted by request id.

        With ``take`` the rows leave the recorder column by column as they are
        copied (at millions of requests the run's end then holds them once, not
        twice); :attr:`num_recorded` still counts them. A recorder that streamed
        rows to disk (``spill_rows``) hands over :class:`SpilledColumns`, which
        it can do once, with ``take``.
        """
        if self._spill is not None:
            if not take:
                raise ValueError("the rows were streamed to disk: take them "
                                 "(request_columns(take=True)), once")
            spill, self._spill = self._spill, None
            n = len(self._i["id"])
            cols = spill.finish(self._take_block() if n else None)
            self._taken += spill.num_rows
            return cols
        ids = np.frombuffer(self._i["id"], dtype=np.int64) if self._i["id"] else np.zeros(0, int)
        order = np.argsort(ids, kind="stable")
        del ids
        cols: dict[str, Any] = {}
        if take:  # each column's array is dropped once copied (a view may still hold it)
            self._appends = ()
        for c in list(self._i):  # read in place, copied once, in id order
            a = self._i[c]
            cols[c] = np.frombuffer(a, dtype=np.int64)[order] if a else np.zeros(0, np.int64)
            if take:
                self._i[c] = array("q")
        for c in list(self._f):
            a = self._f[c]
            cols[c] = np.frombuffer(a, dtype=np.float64)[order] if a else np.zeros(0)
            if take:
                self._f[c] = array("d")
        del a
        if take:
            self._bind_appends()
        n = len(order)
        nones = [None] * n  # one list for every column without a value (read only)
        where = None  # each row's position in id order
        for c, sparse in (("name", self._name), ("tenant", self._tenant), ("cls", self._cls),
                          ("reason", self._reason)):
            if not sparse:
                cols[c] = nones
                continue
            if where is None:
                where = np.empty(n, dtype=np.int64)
                where[order] = np.arange(n)
            col = [None] * n
            for k, v in sparse.items():
                col[where[k]] = v
            cols[c] = col
            if take:
                sparse.clear()
        if take:
            self._taken += n
        return cols

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
        extra_gaps = np.array([g for g, _, _ in self._extra_itl], dtype=np.float64)
        extra_counts = np.array([c for _, c, _ in self._extra_itl], dtype=np.int64)
        return np.concatenate([gaps, extra_gaps]), np.concatenate([counts, extra_counts])

    def itl_times(self) -> np.ndarray:
        """End time of the step each :meth:`itl_samples` entry belongs to (same order)."""
        if self._steps_taken:
            raise ValueError("the steps were handed over by itl_samples(take=True): "
                             "ask for itl_times() before")
        ends, counts = self._steps()
        idx = np.array([k for _, _, k in self._extra_itl], dtype=np.int64)
        extra = ends[np.minimum(idx, ends.size - 1)] if idx.size else np.zeros(0)
        return np.concatenate([ends[counts > 0], extra])

    def series_rows(self) -> dict[str, np.ndarray]:
        """The bounded per-step series (see :class:`StepSeries`)."""
        self._flush()
        if self._series_rest is not None:
            self._to_series([np.zeros(0)] * 5, everything=True)
        return self.series.rows()
