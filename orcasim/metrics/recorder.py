"""The recorder: plain columns appended in the hot path, turned into arrays at the end.

Per request it keeps one row, written when the request reaches its final
state. Per step it keeps (a) the inter-token gap of the step and how many
tokens had it, which is all that exact ITL percentiles need, and (b) a
bounded, time-binned series of batch size, tokens and queue length for plots.
The full per-step batch listing is kept only when asked for (``trace_steps``).
"""

from __future__ import annotations

from array import array
from itertools import repeat
from typing import Any

import numpy as np

from orcasim.metrics.kv_series import KVSeries
from orcasim.metrics.series import StepSeries
from orcasim.request import FINAL_STATES, Request, RequestState

_NAN = float("nan")

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

    def __init__(self, trace_steps: bool = False, series_capacity: int = 4096) -> None:
        self.num_arrived = 0
        self._steps_flushed = 0
        self._sum_batch = 0
        self._f = {c: array("d") for c in REQUEST_FLOAT_COLUMNS}
        self._i = {c: array("q") for c in REQUEST_INT_COLUMNS}
        self._name: list[str | None] = []
        self._tenant: list[str | None] = []
        self._cls: list[str | None] = []
        self._reason: list[str | None] = []
        # per step, kept for the whole run (12 bytes a step): its end and its ITL token count;
        # a step's gap is its end minus the previous step's end (0 before the first)
        self._step_end: list[np.ndarray] = []
        self._itl_count: list[np.ndarray] = []
        self._extra_itl: list[tuple[float, int, int]] = []
        # steps not yet flushed, one column each
        self._t0 = array("d")
        self._t1 = array("d")
        self._seqs = array("q")
        self._tokens = array("q")
        self._waiting = array("q")
        self._count = array("q")
        self._buf_cap = max(16, series_capacity)
        self.series = StepSeries(series_capacity)
        self.trace_steps = trace_steps
        self.kv: KVSeries | None = None  # KV memory use per step, when the run models memory
        self.steps: list[tuple[int, float, float, tuple[str | None, ...]]] = []

    # -- hot path -----------------------------------------------------------
    def record_request(self, req: Request) -> None:
        """Append ``req``'s final row."""
        f, i = self._f, self._i
        f["arrival"].append(req.arrival)
        f["first_scheduled"].append(_NAN if req.first_scheduled is None else req.first_scheduled)
        f["first_token"].append(_NAN if req.first_token is None else req.first_token)
        f["finish"].append(_NAN if req.finish is None else req.finish)
        i["id"].append(req.id)
        i["prompt_len"].append(req.prompt_len)
        i["output_len"].append(req.output_len)
        i["num_output_tokens"].append(req.num_output_tokens)
        i["num_preemptions"].append(req.num_preemptions)
        i["priority"].append(req.priority)
        i["state"].append(int(req.state))
        self._name.append(req.name)
        self._tenant.append(req.tenant)
        self._cls.append(req.cls)
        self._reason.append(req.reason)

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
        self._t0.append(t_start)
        self._t1.append(t_end)
        self._seqs.append(num_seqs)
        self._tokens.append(num_tokens)
        self._waiting.append(num_waiting)
        self._count.append(itl_count)
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
        k = len(ends)
        t0 = self._t0
        t0.append(t_start)
        t0.extend(ends[:-1])
        self._t1.extend(ends)
        self._seqs.extend(repeat(num_seqs, k))
        tokens, count = self._tokens, self._count
        tokens.append(num_tokens[0])
        tokens.extend(repeat(num_tokens[1], k - 1))
        count.append(itl_count[0])
        count.extend(repeat(itl_count[1], k - 1))
        self._waiting.extend(num_waiting)
        if len(self._t1) >= self._buf_cap:
            self._flush()

    def _flush(self) -> None:
        if not self._t1:
            return
        t0 = np.array(self._t0, dtype=np.float64)
        t1 = np.array(self._t1, dtype=np.float64)
        seqs = np.array(self._seqs, dtype=np.int64)
        tokens = np.array(self._tokens, dtype=np.int64)
        waiting = np.array(self._waiting, dtype=np.int64)
        count = np.array(self._count, dtype=np.int64)
        for col in (self._t0, self._t1, self._seqs, self._tokens, self._waiting, self._count):
            del col[:]
        self._steps_flushed += len(t1)
        self._sum_batch += int(seqs.sum())
        self._step_end.append(t1)
        self._itl_count.append(count.astype(np.int32))
        self.series.add_steps(t0, t1, seqs.astype(np.float64), tokens.astype(np.float64),
                              waiting.astype(np.float64))

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

    def record_batch(self, t_start: float, t_end: float, labels: tuple[str | None, ...]) -> None:
        """Per-step batch listing (only when ``trace_steps``); ``None`` is an empty slot."""
        self.steps.append((self.num_steps, t_start, t_end, labels))

    # -- end of run ---------------------------------------------------------
    @property
    def num_recorded(self) -> int:
        return len(self._i["id"])

    def state_counts(self) -> dict[RequestState, int]:
        """Recorded requests by final state."""
        states = np.frombuffer(self._i["state"], dtype=np.int64) if self._i["state"] else \
            np.zeros(0, np.int64)
        return {s: int((states == int(s)).sum()) for s in FINAL_STATES}

    def num_distinct_ids(self) -> int:
        """Distinct request ids among the recorded rows (each request must end once)."""
        return int(np.unique(np.frombuffer(self._i["id"], dtype=np.int64)).size) \
            if self._i["id"] else 0

    def request_columns(self) -> dict[str, Any]:
        """Per-request columns as numpy arrays (and lists for strings), sorted by request id."""
        ids = np.frombuffer(self._i["id"], dtype=np.int64) if self._i["id"] else np.zeros(0, int)
        order = np.argsort(ids, kind="stable")
        cols: dict[str, Any] = {}
        for c, a in self._i.items():
            cols[c] = np.array(a, dtype=np.int64)[order]
        for c, a in self._f.items():
            cols[c] = np.array(a, dtype=np.float64)[order]
        idx = order.tolist()
        for c, lst in (("name", self._name), ("tenant", self._tenant), ("cls", self._cls),
                       ("reason", self._reason)):
            cols[c] = [lst[k] for k in idx]
        return cols

    def _steps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every step's end and ITL token count (flushed first)."""
        self._flush()
        ends = np.concatenate([np.zeros(0), *self._step_end])
        counts = np.concatenate([np.zeros(0, np.int32), *self._itl_count])
        return ends, counts

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """Inter-token gaps as ``(gaps, counts)``: each gap occurred ``count`` times."""
        ends, counts = self._steps()
        keep = counts > 0
        gaps = np.diff(ends, prepend=0.0)[keep]
        extra_gaps = np.array([g for g, _, _ in self._extra_itl], dtype=np.float64)
        extra_counts = np.array([c for _, c, _ in self._extra_itl], dtype=np.int64)
        return (np.concatenate([gaps, extra_gaps]),
                np.concatenate([counts[keep].astype(np.int64), extra_counts]))

    def itl_times(self) -> np.ndarray:
        """End time of the step each :meth:`itl_samples` entry belongs to (same order)."""
        ends, counts = self._steps()
        idx = np.array([k for _, _, k in self._extra_itl], dtype=np.int64)
        extra = ends[np.minimum(idx, ends.size - 1)] if idx.size else np.zeros(0)
        return np.concatenate([ends[counts > 0], extra])

    def series_rows(self) -> dict[str, np.ndarray]:
        """The bounded per-step series (see :class:`StepSeries`)."""
        self._flush()
        return self.series.rows()
