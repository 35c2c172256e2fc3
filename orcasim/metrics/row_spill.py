"""Per-request rows streamed to disk during a long run, in request-id order.

A run of more than :data:`STREAM_ABOVE` requests does not hold every
request's row until its end. The recorder hands over blocks of
:data:`SPILL_ROWS` rows as they fill (:meth:`RowSpill.add`); rows arrive in
the order requests end, so a block waits in a small pending buffer until every
id before it has ended, and is then written to a Parquet file as a row group,
in id order (the order of ``requests.parquet``). A request that stays
unfinished for long keeps the rows after it pending: memory grows toward what
the run would hold without streaming, never past it, and the file stays in
id order.

Only compact columns stay in memory: the four timestamps, the output-token
count and the final state (what the summary's exact percentiles and the plots
read), and the class, tenant and reason labels as integer codes when a run
has any. :class:`SpilledColumns` serves those from memory and every other
column by reading it back from the file, so code that indexes a run's
columns works unchanged; ``requests.parquet`` and
:attr:`~orcasim.metrics.results.VariantResult.requests` are built from the
file :data:`~orcasim.metrics.request_table.ROWS_PER_CHUNK` rows at a time.
The file lives in a temporary directory that is removed with the results.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.request import RequestState

if TYPE_CHECKING:
    import pyarrow as pa

#: runs of more requests than this stream their rows to disk (see the module's docstring)
STREAM_ABOVE = 1_000_000
#: rows per block handed from the recorder to the spill (and per row group of its file)
SPILL_ROWS = 1 << 18

INT_COLUMNS = ("id", "prompt_len", "output_len", "num_output_tokens", "num_preemptions",
               "priority", "state")
FLOAT_COLUMNS = ("arrival", "first_scheduled", "first_token", "finish")
STRING_COLUMNS = ("name", "tenant", "cls", "reason")
#: numeric columns kept in memory, in id order (what the summary and the plots read)
COMPACT = ("num_output_tokens", "state", *FLOAT_COLUMNS)
#: label columns kept in memory as codes (-1: none) when the run has any
CODED = ("tenant", "cls", "reason")


def _schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([*((c, pa.int64()) for c in INT_COLUMNS),
                      *((c, pa.float64()) for c in FLOAT_COLUMNS),
                      *((c, pa.string()) for c in STRING_COLUMNS)])


def _take(block: dict[str, np.ndarray], idx: Any) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in block.items()}


class RowSpill:
    """Writes request rows to a temporary Parquet file in id order as they are handed over.

    Blocks are dicts of numpy columns (strings as object arrays), one row per
    request, in any order. Ids are expected to run 0, 1, 2, ...; rows are
    written as soon as every smaller id has been handed over.
    """

    def __init__(self, expected_rows: int = 0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="orcasim-rows-"))
        self.path = self.dir / "requests.parquet"
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.dir), True)
        self._writer: Any = None
        self._pending: dict[str, np.ndarray] | None = None
        self._next_id = 0  # every id below it is written
        self.num_rows = 0  # rows handed over
        self.num_written = 0
        self.state_counts = np.zeros(len(RequestState), dtype=np.int64)
        # the compact columns, filled in id order as rows are written (grown if need be)
        self._compact = {c: np.empty(expected_rows, dtype=np.float64 if c in FLOAT_COLUMNS
                                     else np.int64) for c in COMPACT}
        self._labels: dict[str, dict[str, int]] = {c: {} for c in CODED}
        self._codes: dict[str, list[np.ndarray | int]] = {c: [] for c in CODED}

    def add(self, block: dict[str, np.ndarray]) -> None:
        """Take a block of rows; write every row whose smaller ids have all been handed over."""
        n = len(block["id"])
        if not n:
            return
        self.num_rows += n
        self.state_counts += np.bincount(block["state"], minlength=len(RequestState))
        pending = self._pending
        if pending is not None:
            block = {k: np.concatenate([pending[k], block[k]]) for k in block}
        block = _take(block, np.argsort(block["id"], kind="stable"))
        ids = block["id"]
        bad = np.flatnonzero(ids != self._next_id + np.arange(ids.size))
        k = int(bad[0]) if bad.size else ids.size  # the complete run of ids from _next_id
        if k:
            self._write(_take(block, slice(0, k)))
            self._next_id += k
        self._pending = _take(block, slice(k, None)) if k < ids.size else None
        if self._pending is not None:
            self._pending = {c: v.copy() for c, v in self._pending.items()}

    def num_distinct_ids(self, held: Any = ()) -> int:
        """Distinct ids among the rows handed over and the ids ``held`` (not handed over yet).

        The written rows are ids ``0 .. _next_id - 1``, once each; a pending or held id
        below that repeats one of them.
        """
        rest = np.frombuffer(held, dtype=np.int64) if len(held) else np.zeros(0, np.int64)
        if self._pending is not None:
            rest = np.concatenate([self._pending["id"], rest])
        return self._next_id + int(np.unique(rest[rest >= self._next_id]).size)

    def _write(self, part: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _schema()
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, schema,
                                            use_dictionary=list(STRING_COLUMNS))
        table = pa.table({f.name: pa.array(part[f.name], type=f.type) for f in schema},
                         schema=schema)
        self._writer.write_table(table)
        lo, hi = self.num_written, self.num_written + len(table)
        for c in COMPACT:
            col = self._compact[c]
            if hi > col.size:  # more rows than expected
                col = self._compact[c] = np.concatenate([col[:lo], np.empty(max(hi, 2 * lo),
                                                                            col.dtype)])
            col[lo:hi] = part[c]
        self.num_written = hi
        for c in CODED:
            col = part[c]
            has = np.flatnonzero(col != None)  # noqa: E711 (element-wise)
            if not has.size:
                self._codes[c].append(col.size)  # a run of rows without a label
                continue
            labels = self._labels[c]
            codes = np.full(col.size, -1, dtype=np.int32)
            for i in has.tolist():
                codes[i] = labels.setdefault(col[i], len(labels))
            self._codes[c].append(codes)

    def finish(self, extra: dict[str, np.ndarray] | None = None) -> SpilledColumns:
        """Add the last rows (``extra``), write whatever is pending and close the file."""
        if extra is not None:
            self.add(extra)
        pending, self._pending = self._pending, None
        if pending is not None:  # ids missing below them: written in id order at the end
            self._write(pending)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        n = self.num_written
        compact = {c: col if col.size == n else col[:n].copy()
                   for c, col in self._compact.items()}
        self._compact = {}
        codes = {}
        for c in CODED:
            chunks = self._codes[c]
            if self._labels[c]:
                codes[c] = np.concatenate([np.full(x, -1, np.int32) if isinstance(x, int) else x
                                           for x in chunks])
            chunks.clear()
        return SpilledColumns(self, compact, codes,
                              {c: list(self._labels[c]) for c in codes})


class SpilledColumns(Mapping[str, Any]):
    """A run's per-request columns, in id order, most of them read back from disk on demand.

    Indexing gives what the in-memory columns give (numpy arrays for numbers,
    lists for strings); columns added after the run (``sent``) are held in
    memory. Pickling gives a plain dict of every column.
    """

    def __init__(self, spill: RowSpill, compact: dict[str, np.ndarray],
                 codes: dict[str, np.ndarray], labels: dict[str, list[str]]) -> None:
        self._spill = spill  # owns the file (removed when the last reference goes)
        self.path = spill.path
        self.num_rows = spill.num_written
        self._compact = compact
        self._codes = codes
        self._labels = labels
        self._extra: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._compact:
            return self._compact[key]
        if key in self._extra:
            return self._extra[key]
        if key in CODED:
            codes = self._codes.get(key)
            if codes is None:
                return [None] * self.num_rows
            labels = [*self._labels[key], None]  # code -1 picks the None at the end
            return [labels[k] for k in codes.tolist()]
        if key in INT_COLUMNS or key in FLOAT_COLUMNS or key == "name":
            import pyarrow.parquet as pq

            col = pq.read_table(self.path, columns=[key]).column(0)
            return col.to_pylist() if key == "name" else col.to_numpy()
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        """Add a column computed after the run (one value per request, in id order)."""
        if key in self._compact or key in INT_COLUMNS or key in STRING_COLUMNS:
            raise KeyError(f"{key!r} is a recorded column")
        self._extra[key] = value

    def __iter__(self) -> Iterator[str]:
        yield from INT_COLUMNS
        yield from FLOAT_COLUMNS
        yield from STRING_COLUMNS
        yield from self._extra

    def __len__(self) -> int:
        return len(INT_COLUMNS) + len(FLOAT_COLUMNS) + len(STRING_COLUMNS) + len(self._extra)

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self.items()),)

    def batches(self, rows: int, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The columns ``rows`` requests at a time, in id order (the first ``limit`` only)."""
        import pyarrow.parquet as pq

        lo = 0
        end = self.num_rows if limit is None else min(limit, self.num_rows)
        if end == 0:
            yield {**_empty(), **{k: v[:0] for k, v in self._extra.items()}}
            return
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=rows):
            if lo >= end:
                break
            batch = batch.slice(0, end - lo)
            cols: dict[str, Any] = {}
            for name, col in zip(batch.schema.names, batch.columns, strict=True):
                cols[name] = col.to_pylist() if name in STRING_COLUMNS else col.to_numpy()
            for k, v in self._extra.items():
                cols[k] = v[lo:lo + len(batch)]
            lo += len(batch)
            yield cols


def _empty() -> dict[str, Any]:
    return {**{c: np.zeros(0, np.int64) for c in INT_COLUMNS},
            **{c: np.zeros(0) for c in FLOAT_COLUMNS}, **{c: [] for c in STRING_COLUMNS}}
