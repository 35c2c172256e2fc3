"""A run's per-request rows: appended as requests end, handed over as numpy columns.

One row per request, written when it reaches its final state (finished,
rejected or aborted): numbers in typed arrays, one per column, and the
string columns sparse (most requests have no name, tenant, class or reason).
With ``spill_rows``, every block of that many rows goes to a
:class:`~orcasim.metrics.row_spill.RowSpill` on disk as it fills.
"""

from __future__ import annotations

import sys
from array import array
from operator import attrgetter
from typing import Any

import numpy as np

from orcasim.metrics.row_spill import RowSpill, SpilledColumns
from orcasim.request import FINAL_STATES, Request, RequestState

_NAN = float("nan")
#: rows :meth:`RequestRows.record_finished` holds before writing them
DONE_BLOCK = 4096
#: where a workload row held as finished (``[index, first scheduled, first token, finish,
#: ...]``) keeps its request's preemptions, if it has that many fields (else none)
ROW_PREEMPTIONS = 6
#: rows of one kind that :meth:`RequestRows._write_done` writes on their own (fewer: together)
_RUN = 64

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


def distinct_count(ids: np.ndarray) -> int:
    """How many distinct values the integer array ``ids`` holds.

    Request ids are dense (a workload's row numbers), so a mark per id in
    their range counts them in linear time; a sparse range falls back to
    sorting.
    """
    if not ids.size:
        return 0
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo > 4 * ids.size:
        return int(np.unique(ids).size)
    seen = np.zeros(hi - lo + 1, dtype=bool)
    seen[ids - lo] = True
    return int(np.count_nonzero(seen))


class RequestRows:
    """The per-request rows of a :class:`~orcasim.metrics.recorder.Recorder`."""

    def __init__(self, spill_rows: int | None = None, expected_rows: int = 0) -> None:
        # with spill_rows: every block of that many rows goes to a RowSpill (on disk, in id
        # order) as it fills; see orcasim.metrics.row_spill
        self._spill_at = spill_rows or sys.maxsize
        self._expected_rows = expected_rows  # how many rows the spill makes room for
        self._spill: RowSpill | None = None
        self._taken = 0  # rows handed over by request_columns(take=True)
        self._f = {c: array("d") for c in REQUEST_FLOAT_COLUMNS}
        self._i = {c: array("q") for c in REQUEST_INT_COLUMNS}
        # string columns, sparse (row -> value; most are None)
        self._name: dict[int, str] = {}
        self._tenant: dict[int, str] = {}
        self._cls: dict[int, str] = {}
        self._reason: dict[int, str] = {}
        self._done: list[Any] = []  # finished rows not yet written (record_finished)
        self._row_source: tuple[Any, ...] | None = None  # (see set_row_source)
        self._bind_appends()

    def _bind_appends(self) -> None:
        f, i = self._f, self._i
        self._appends: tuple = (f["arrival"].append, f["first_scheduled"].append,
                                f["first_token"].append, f["finish"].append,
                                *(i[c].append for c in REQUEST_INT_COLUMNS))

    def record_request(self, req: Request) -> None:
        """Append ``req``'s final row."""
        if self._done:
            self._write_done()
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

    def record_finished(self, reqs: list[Request]) -> None:
        """Append the final rows of finished ``reqs`` that were scheduled and emitted a first
        token, each as :meth:`record_request` writes it.

        The rows are held and written a block at a time, column by column,
        before anything reads the rows or records another way, so their
        order is kept. :attr:`_done` may also hold a row of the workload
        (see :meth:`set_row_source`) as ``[index, first scheduled, first
        token, finish]``.
        """
        done = self._done
        done += reqs
        if len(done) >= DONE_BLOCK:
            self._write_done()

    def set_row_source(self, owner: object, arrival: Any, prompt_len: Any, output_len: Any
                       ) -> bool:
        """The workload columns of ``owner`` (a source) that rows held as indices are read
        from; False if another owner's are set already."""
        if self._row_source is not None and self._row_source[0] is not owner:
            return False
        self._row_source = (owner, *(np.asarray(c) for c in (arrival, prompt_len, output_len)))
        return True

    def _write_done(self) -> None:
        """Write the rows held by :meth:`record_finished`, handing each full block to the spill
        at the row where :meth:`record_request` would."""
        done = self._done
        if not done:
            return
        held = done[:]
        done.clear()
        at = 0
        while at < len(held):
            row = len(self._i["id"])
            kind = type(held[at])
            end = min(len(held), at + self._spill_at - row)
            stop = at + 1
            while stop < end and type(held[stop]) is kind:
                stop += 1
            if stop < end and stop - at < _RUN:  # short runs of both kinds: in one pass, up
                while stop < end:  # to the next run of _RUN rows of one kind
                    run, of = stop, type(held[stop])
                    while stop < end and type(held[stop]) is of and stop - run < _RUN:
                        stop += 1
                    if stop - run >= _RUN:
                        stop = run
                        break
                kind = None
            chunk = held[at:stop]
            at = stop
            if kind is list:
                self._write_indexed(chunk)
            elif kind is None:
                self._write_mixed(chunk, row)
            else:
                self._write_requests(chunk, row)
            if row + len(chunk) >= self._spill_at:
                self._spill_block()

    def _write_indexed(self, rows: list[list]) -> None:
        """Rows ``[workload index, first scheduled, first token, finish]`` of finished requests
        without per-request attributes, the rest read from the row source; a row with more
        fields holds the request's preemptions at :data:`ROW_PREEMPTIONS`."""
        f, i = self._f, self._i
        ids_list = [r[0] for r in rows]
        ids = np.array(ids_list, dtype=np.int64)
        _, arrival, prompt, output = self._row_source  # type: ignore[misc]
        out = output[ids].astype(np.int64)
        zeros = np.zeros(len(rows), np.int64)
        preempted = zeros
        if max(map(len, rows)) > ROW_PREEMPTIONS:  # rows preempted before (see below)
            preempted = np.array([r[ROW_PREEMPTIONS] if len(r) > ROW_PREEMPTIONS else 0
                                  for r in rows], np.int64)
        f["arrival"].frombytes(arrival[ids].astype(np.float64).tobytes())
        f["first_scheduled"].fromlist([r[1] for r in rows])
        f["first_token"].fromlist([r[2] for r in rows])
        f["finish"].fromlist([r[3] for r in rows])
        for col, values in (("id", ids), ("prompt_len", prompt[ids].astype(np.int64)),
                            ("output_len", out), ("num_output_tokens", out),
                            ("num_preemptions", preempted), ("priority", zeros),
                            ("state", np.full(len(rows), int(RequestState.FINISHED), np.int64))):
            i[col].frombytes(values.tobytes())

    def _write_mixed(self, chunk: list[Any], row: int) -> None:
        """Rows of finished requests and of the workload (as :meth:`_write_indexed` reads
        them), in their order, from ``row`` on."""
        _, arrival, prompt, output = self._row_source  # type: ignore[misc]
        ids = np.array([r[0] for r in chunk if type(r) is list], dtype=np.int64)
        looked = zip(arrival[ids].astype(np.float64).tolist(),
                     prompt[ids].astype(np.int64).tolist(), output[ids].astype(np.int64).tolist(),
                     strict=True)
        done = int(RequestState.FINISHED)
        values = []
        for r in chunk:
            if type(r) is list:
                t, p, o = next(looked)
                values.append((t, r[1], r[2], r[3], r[0], p, o, o,
                               r[ROW_PREEMPTIONS] if len(r) > ROW_PREEMPTIONS else 0, 0, done))
            else:
                values.append((r.arrival, r.first_scheduled, r.first_token, r.finish, r.id,
                               r.prompt_len, r.output_len, r.num_output_tokens,
                               r.num_preemptions, r.priority, r.state))
        cols = list(zip(*values, strict=True))
        for name, col in zip(REQUEST_FLOAT_COLUMNS + REQUEST_INT_COLUMNS, cols, strict=True):
            (self._f if name in REQUEST_FLOAT_COLUMNS else self._i)[name].fromlist(list(col))
        reqs = [(k, r) for k, r in enumerate(chunk, row) if type(r) is not list]
        for sparse, key in ((self._name, "name"), (self._tenant, "tenant"), (self._cls, "cls"),
                            (self._reason, "reason")):
            for k, r in reqs:
                v = getattr(r, key)
                if v is not None:
                    sparse[k] = v

    def _write_requests(self, chunk: list[Request], row: int) -> None:
        """Finished requests' rows, from ``row`` on."""
        f, i = self._f, self._i
        # (each column read in one pass in C: the same values as a list made into the array)
        n = len(chunk)
        for name in REQUEST_FLOAT_COLUMNS:
            f[name].frombytes(np.fromiter(map(attrgetter(name), chunk), np.float64, n).tobytes())
        for name in REQUEST_INT_COLUMNS:
            i[name].frombytes(np.fromiter(map(attrgetter(name), chunk), np.int64, n).tobytes())
        for sparse, values in ((self._name, [r.name for r in chunk]),
                               (self._tenant, [r.tenant for r in chunk]),
                               (self._cls, [r.cls for r in chunk]),
                               (self._reason, [r.reason for r in chunk])):
            if values.count(None) < len(values):
                for k, v in enumerate(values, row):
                    if v is not None:
                        sparse[k] = v

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

    @property
    def num_recorded(self) -> int:
        """Rows recorded so far (read without writing the rows held: a progress display reads
        it from another thread)."""
        spilled = self._spill.num_rows if self._spill is not None else 0
        return len(self._i["id"]) + len(self._done) + self._taken + spilled

    def state_counts(self) -> dict[RequestState, int]:
        """Recorded requests by final state."""
        self._write_done()
        states = np.frombuffer(self._i["state"], dtype=np.int64) if self._i["state"] else \
            np.zeros(0, np.int64)
        spilled = self._spill.state_counts if self._spill is not None else None
        return {s: int((states == int(s)).sum()) + (int(spilled[s]) if spilled is not None
                                                    else 0) for s in FINAL_STATES}

    def num_distinct_ids(self) -> int:
        """Distinct request ids among the recorded rows (each request must end once)."""
        self._write_done()
        if self._spill is not None:
            return self._spill.num_distinct_ids(self._i["id"])
        return distinct_count(np.frombuffer(self._i["id"], dtype=np.int64)) if self._i["id"] \
            else 0

    def request_columns(self, take: bool = False) -> dict[str, Any] | SpilledColumns:
        """Per-request columns as numpy arrays (and lists for strings), sorted by request id.

        With ``take`` the rows leave the recorder column by column as they are
        copied (at millions of requests the run's end then holds them once, not
        twice); :attr:`num_recorded` still counts them. A recorder that streamed
        rows to disk (``spill_rows``) hands over :class:`SpilledColumns`, which
        it can do once, with ``take``.
        """
        self._write_done()
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
