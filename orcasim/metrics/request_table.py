"""Per-request rows as an Arrow table, built column by column from the recorder's arrays.

``orcasim run`` writes them as ``requests.parquet`` without building a pandas
DataFrame (at a million requests a DataFrame of Python strings costs seconds
and hundreds of megabytes); the columns and their order are those of
:attr:`~orcasim.metrics.results.VariantResult.requests`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orcasim.metrics.row_spill import SpilledColumns
from orcasim.metrics.summary import request_latencies
from orcasim.request import RequestState

if TYPE_CHECKING:
    import pyarrow as pa

#: state names by their integer code
STATE_NAMES = [RequestState(i).name.lower() for i in range(len(RequestState))]


def request_table(columns: Mapping[str, Any], variant: str | None = None) -> pa.Table:
    """One row per request (``variant`` first when given), latencies last."""
    import pyarrow as pa
    import pyarrow.compute as pc

    c = columns
    ids = pa.array(c["id"], type=pa.int64())
    names = pa.array(c["name"], type=pa.string())
    if names.null_count:  # a request without a name is labelled by its id
        names = pc.if_else(pc.is_null(names), pc.cast(ids, pa.string()), names)
    states = pc.take(pa.array(STATE_NAMES, type=pa.string()),
                     pa.array(np.asarray(c["state"], dtype=np.int64)))
    cols: dict[str, Any] = {}
    if variant is not None:
        cols["variant"] = pa.repeat(pa.scalar(variant, pa.string()), len(ids))
    cols.update({"id": ids, "name": names})
    if "sent" in c:  # the API server is modelled: when each client sent its request
        cols["sent"] = c["sent"]
    cols.update({
        "arrival": c["arrival"],
        "first_scheduled": c["first_scheduled"],
        "first_token": c["first_token"],
        "finish": c["finish"],
        "prompt_len": c["prompt_len"],
        "output_len": c["output_len"],
        "num_output_tokens": c["num_output_tokens"],
        "state": states,
        "reason": pa.array(c["reason"], type=pa.string()),
        "priority": c["priority"],
        "cls": pa.array(c["cls"], type=pa.string()),
        "tenant": pa.array(c["tenant"], type=pa.string()),
        "num_preemptions": c["num_preemptions"],
    })
    if "replica" in c:  # a cluster run: the replica that served it (None: rejected)
        cols["replica"] = pa.array(c["replica"], type=pa.string())
    for k in ("kv_reserve_wait", "kv_link_wait", "kv_transfer_time", "decode_start"):
        if k in c:  # disaggregated prefill/decode: the KV transfer's stages
            cols[k] = c[k]
    cols.update(request_latencies(c))
    return pa.table(cols)


#: rows per Arrow table written at once: at ten million requests the whole table would
#: cost more than a gigabyte beside the columns it is built from
ROWS_PER_CHUNK = 1_000_000


def request_tables(columns: Mapping[str, Any], variant: str | None = None,
                   rows: int | None = None) -> Iterator[pa.Table]:
    """:func:`request_table` of ``rows`` requests at a time (default :data:`ROWS_PER_CHUNK`;
    one empty table for none)."""
    rows = rows or ROWS_PER_CHUNK
    if isinstance(columns, SpilledColumns):  # read back from its file, a chunk at a time
        for chunk in columns.batches(rows):
            yield request_table(chunk, variant)
        return
    n = len(columns["id"])
    for lo in range(0, max(n, 1), rows):
        yield request_table({k: v[lo:lo + rows] for k, v in columns.items()}, variant)


def head(columns: Mapping[str, Any], n: int | None) -> Mapping[str, Any]:
    """The columns of the first ``n`` requests (all with ``None``)."""
    if isinstance(columns, SpilledColumns):
        if n is None:
            n = columns.num_rows
        return next(columns.batches(max(n, 1), limit=n))
    return columns if n is None else {k: v[:n] for k, v in columns.items()}


def num_rows(columns: Mapping[str, Any]) -> int:
    """How many requests ``columns`` has."""
    if isinstance(columns, SpilledColumns):
        return columns.num_rows
    return len(columns["id"])


def write_requests_parquet(path: Path, tables: Iterable[pa.Table],
                           variants: Sequence[Mapping[str, Any]] = ()) -> None:
    """Write ``tables`` one after another into one Parquet file (a row group or more each),
    holding one at a time.

    ``variants``: the request columns of every variant written, when they may differ in
    their optional columns (``sent``, ``replica``): the file then has every column, in the
    widest variant's order, null in the rows of variants without it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    it = iter(tables)
    first = next(it)
    schema = first.schema
    if variants:
        empty = [request_table(head(c, 0), "").schema for c in variants]
        widest = max(empty, key=len)
        schema = pa.unify_schemas([widest, *empty])
        if first.schema.names[:1] != ["variant"]:
            schema = schema.remove(schema.get_field_index("variant"))

    def conform(t: pa.Table) -> pa.Table:
        if t.schema == schema:
            return t
        return pa.table({f.name: t[f.name] if f.name in t.column_names
                         else pa.nulls(len(t), f.type) for f in schema}, schema=schema)

    # dictionary pages for the text columns only: numbers are nearly all distinct, and
    # trying a dictionary on each of them costs more than the rest of the write
    text = [f.name for f in schema if pa.types.is_string(f.type)]
    with pq.ParquetWriter(path, schema, use_dictionary=text) as writer:
        writer.write_table(conform(first))
        del first
        for t in it:
            writer.write_table(conform(t))
