"""Trace files: Azure LLM inference 2023, Mooncake JSON Lines, length tables, ShareGPT JSON,
token-id JSON Lines (:mod:`orcasim.workload.token_trace`).

:func:`load_trace` reads a trace into a :class:`Trace` (columns of numbers,
seconds and tokens). ``file`` is a path or the name of a slice shipped in
``orcasim/data/traces`` (``azure_conv``, ``azure_code``,
``mooncake_conversation``, ``sharegpt_lengths``, ``arxiv_lengths``,
``bwb_lengths``; see the README there for sources and licences).

Every row becomes a request or the file is refused: a missing column, a
field that is not a number, a negative length, a length beyond
:data:`~orcasim.workload.base.MAX_TOKENS_PER_REQUEST`, an output of zero
tokens, a timestamp that is not finite or earlier than the one before it, or
a JSON line nested too deeply stops the load with one line naming the file
and line (:class:`TraceError`). Files are read as UTF-8, with or without a
byte-order mark. Loaded traces are cached by path,
modification time and options, so sweeps read a file once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from orcasim.workload.base import MAX_TOKENS_PER_REQUEST
from orcasim.workload.trace_columns import (
    TraceError,
    check_sorted,
    csv_columns,
    float_column,
    int_column,
    json_row,
    range_problem,
    show_value,
)

SHIPPED = {
    "azure_conv": "azure_conv.csv",
    "azure_code": "azure_code.csv",
    "mooncake_conversation": "mooncake_conversation.jsonl",
    "sharegpt_lengths": "sharegpt_lengths.csv",
    "arxiv_lengths": "arxiv_lengths.csv",
    "bwb_lengths": "bwb_lengths.csv",
}

FORMATS = ("auto", "azure", "mooncake", "lengths", "sharegpt", "tokens")

#: characters per token of the estimate used when no tokenizer is given
CHARS_PER_TOKEN = 4
#: text encoding of trace files: UTF-8, skipping a byte-order mark if there is one
ENCODING = "utf-8-sig"
#: the largest block id a Mooncake ``hash_ids`` list may hold
MAX_HASH_ID = 2**63 - 1


@dataclass(frozen=True)
class Trace:
    """A trace as columns, one row per request, in file order.

    ``arrival`` is seconds from the start of the trace (the first row is at 0
    for the Azure traces, whose timestamps are wall-clock times); ``None``
    for length tables. ``hash_ids`` (Mooncake) lists each prompt's block
    ids, ``hash_block_size`` tokens per id. ``session`` and ``turn`` number
    the conversation and turn of each row (ShareGPT JSON);
    ``new_prompt_len`` is the tokens a turn adds to its conversation.
    """

    source: str
    prompt_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray | None = None
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    hash_block_size: int = 0
    session: np.ndarray | None = None
    turn: np.ndarray | None = None
    new_prompt_len: np.ndarray | None = None
    num_skipped: int = 0

    def __len__(self) -> int:
        return len(self.prompt_len)


def resolve(file: str | Path) -> tuple[Any, str]:
    """``(readable path, name for messages)`` for a path or a shipped slice's name."""
    name = str(file)
    if name in SHIPPED:
        return resources.files("orcasim") / "data" / "traces" / SHIPPED[name], name
    p = Path(name).expanduser()
    if not p.is_file():
        known = ", ".join(SHIPPED)
        raise TraceError(name, f"no such trace file (shipped slices: {known})")
    return p, name


def detect_format(file: str | Path) -> str:
    """The format of a trace from its name and first line."""
    return _detect(*resolve(file))


def _detect(path: Any, name: str) -> str:
    suffix = Path(str(path)).suffix.lower()
    if suffix == ".jsonl":
        return "tokens" if _first_line_has(path, '"input_tok_ids"') else "mooncake"
    if suffix == ".json":
        return "sharegpt"
    try:
        with path.open("r", encoding=ENCODING) as fh:
            header = fh.readline()
            blank = not header.strip() and not fh.read(4096).strip()
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(name, f"cannot read: {err}") from None
    if blank:
        raise TraceError(name, "the trace has no rows")
    cols = [c.strip() for c in header.split(",")]
    if "TIMESTAMP" in cols:
        return "azure"
    if "num_prefill_tokens" in cols:
        return "lengths"
    raise TraceError(name, "cannot tell the trace format from its name and header; "
                     f"set format to one of {', '.join(FORMATS[1:])}", 1)


def _first_line_has(path: Any, needle: str) -> bool:
    """Whether the first line of the file at ``path`` contains ``needle`` (False if unreadable)."""
    try:
        with path.open("r", encoding=ENCODING) as fh:
            return needle in fh.readline()
    except (OSError, UnicodeDecodeError):
        return False


def load_trace(
    file: str | Path,
    format: str = "auto",
    *,
    tokenizer: str | None = None,
    hash_block_size: int = 512,
) -> Trace:
    """Read a trace file (or shipped slice) in ``format`` (``auto``: from name and header)."""
    path, name = resolve(file)
    if format == "auto":
        format = _detect(path, name)
    if format not in FORMATS:
        raise TraceError(name, f"unknown trace format {format!r} (known: {', '.join(FORMATS)})")
    stamp = (0, 0)
    if isinstance(path, Path):
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    return _load_cached(path, name, stamp, format, tokenizer, hash_block_size)


@lru_cache(maxsize=16)
def _load_cached(path: Any, name: str, stamp: tuple[int, int], format: str,
                 tokenizer: str | None, hash_block_size: int) -> Trace:
    """The trace at ``path``; ``stamp`` (mtime, size) is in the key so an edited file reloads."""
    try:
        text = path.read_text(encoding=ENCODING)
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(name, f"cannot read: {err}") from None
    if not text.strip():
        raise TraceError(name, "the trace has no rows")
    if format == "azure":
        trace = _azure(text, name)
    elif format == "lengths":
        trace = _lengths(text, name)
    elif format == "mooncake":
        trace = _mooncake(text, name, hash_block_size)
    elif format == "tokens":
        from orcasim.workload.token_trace import load_token_trace

        trace = load_token_trace(text, name, hash_block_size)
    else:
        from orcasim.workload.sharegpt import load_sharegpt

        trace = load_sharegpt(text, name, tokenizer)
    for a in (trace.prompt_len, trace.output_len, trace.arrival, trace.session, trace.turn,
              trace.new_prompt_len):
        if a is not None:
            a.setflags(write=False)
    return trace


def _azure(text: str, name: str) -> Trace:
    cols, lines = csv_columns(text, name, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    stamps = cols["TIMESTAMP"]
    try:
        t = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        for v, line in zip(stamps, lines, strict=True):
            try:
                np.datetime64(v, "ns")
            except ValueError:
                raise TraceError(name, f"TIMESTAMP: {v!r} is not a date and time", line) from None
        raise
    if np.isnat(t).any():
        k = int(np.flatnonzero(np.isnat(t))[0])
        raise TraceError(name, f"TIMESTAMP: {stamps[k]!r} is not a date and time", lines[k])
    ns = (t - t[0]).astype(np.int64)
    check_sorted(ns, "TIMESTAMP", name, lines)
    return Trace(
        source=name,
        arrival=ns / 1e9,
        prompt_len=int_column(cols["ContextTokens"], "ContextTokens", name, lines),
        output_len=int_column(cols["GeneratedTokens"], "GeneratedTokens", name, lines, min_value=1),
    )


def _lengths(text: str, name: str) -> Trace:
    header = [c.strip() for c in text.split("\n", 1)[0].split(",")]
    optional = [c for c in ("arrived_at", "num_total_tokens") if c in header]
    cols, lines = csv_columns(text, name, ["num_prefill_tokens", "num_decode_tokens", *optional])
    prompt = int_column(cols["num_prefill_tokens"], "num_prefill_tokens", name, lines)
    output = int_column(cols["num_decode_tokens"], "num_decode_tokens", name, lines, min_value=1)
    arrival = None
    if "arrived_at" in cols:
        arrival = float_column(cols["arrived_at"], "arrived_at", name, lines)
        check_sorted(arrival, "arrived_at", name, lines)
    if "num_total_tokens" in cols:
        total = int_column(cols["num_total_tokens"], "num_total_tokens", name, lines)
        bad = np.flatnonzero(total != prompt + output)
        if bad.size:
            k = int(bad[0])
            raise TraceError(name, f"num_total_tokens {int(total[k])} is not num_prefill_tokens "
                             f"+ num_decode_tokens ({int(prompt[k] + output[k])})", lines[k])
    return Trace(source=name, prompt_len=prompt, output_len=output, arrival=arrival)


# -- Mooncake JSON Lines ------------------------------------------------------------------------

def _mooncake(text: str, name: str, block_size: int) -> Trace:
    stamps: list[Any] = []
    prompt: list[Any] = []
    output: list[Any] = []
    hashes: list[tuple[int, ...]] = []
    lines: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        row = json_row(raw, name, lineno)
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in row:
                raise TraceError(name, f"missing key {key!r}", lineno)
        ids = row["hash_ids"]
        if not isinstance(ids, list) or not all(type(h) is int and h >= 0 for h in ids):
            raise TraceError(name, "hash_ids must be a list of whole numbers >= 0", lineno)
        if any(h > MAX_HASH_ID for h in ids):
            raise TraceError(name, "hash_ids: a block id is more than 2**63 - 1", lineno)
        n_in = row["input_length"]
        if type(n_in) is int and n_in > MAX_TOKENS_PER_REQUEST:
            raise TraceError(name, range_problem("input_length", n_in, 0,
                                                  MAX_TOKENS_PER_REQUEST), lineno)
        if type(n_in) is int and n_in >= 0 and len(ids) != math.ceil(n_in / block_size):
            raise TraceError(name, f"{len(ids)} hash_ids for input_length {n_in}: expected "
                             f"ceil({n_in} / {block_size}) = {math.ceil(n_in / block_size)} "
                             "(set hash_block_size if the trace uses another block size)", lineno)
        stamps.append(row["timestamp"])
        prompt.append(n_in)
        output.append(row["output_length"])
        hashes.append(tuple(ids))
        lines.append(lineno)
    return block_trace(name, lines, ("timestamp", stamps, 1000.0), ("input_length", prompt),
                       ("output_length", output), hashes, block_size)


def block_trace(
    name: str,
    lines: list[int],
    stamps: tuple[str, list[Any], float],
    prompt: tuple[str, list[Any]],
    output: tuple[str, list[Any]],
    hashes: list[tuple[int, ...]],
    block_size: int,
) -> Trace:
    """The :class:`Trace` of JSON Lines rows read into columns, each with its column name:
    arrival stamps (``(column, values, units per second)``), prompt and output lengths, and
    each row's block ids; a row with a bad field is a :class:`TraceError` naming its line."""
    if not lines:
        raise TraceError(name, "the trace has no rows")
    column, values, per_second = stamps
    for v, line in zip(values, lines, strict=True):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TraceError(name, f"{column}: {show_value(v)} is not a number", line)
    t = float_column(values, column, name, lines) / per_second
    check_sorted(t, column, name, lines)
    return Trace(
        source=name,
        arrival=t,
        prompt_len=int_column(prompt[1], prompt[0], name, lines),
        output_len=int_column(output[1], output[0], name, lines, min_value=1),
        hash_ids=tuple(hashes),
        hash_block_size=block_size,
    )
