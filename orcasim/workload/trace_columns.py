"""Reading a trace's columns: CSV and JSON Lines rows, whole-number and finite-number
columns, and the one-line :class:`TraceError` naming the file and line of the first bad value.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from orcasim.errors import OrcasimError
from orcasim.workload.base import MAX_TOKENS_PER_REQUEST


class TraceError(OrcasimError):
    """A trace file is missing or malformed: ``str()`` is ``file:line: message``."""

    exit_code = 2

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        super().__init__(source, message, line)
        self.source = source
        self.line = line
        self.message = message

    def __str__(self) -> str:
        at = f":{self.line}" if self.line is not None else ""
        return f"{self.source}{at}: {self.message}"


# -- CSV --------------------------------------------------------------------------------------

def csv_columns(text: str, name: str, need: Sequence[str]
                ) -> tuple[dict[str, list[str]], list[int]]:
    """Columns named in ``need`` as strings, and the line number of each row."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = [c.strip() for c in next(reader)]
    except StopIteration:
        raise TraceError(name, "the trace has no rows") from None
    missing = [c for c in need if c not in header]
    if missing:
        raise TraceError(name, f"missing column {missing[0]!r} (columns: {', '.join(header)})", 1)
    idx = [header.index(c) for c in need]
    cols: dict[str, list[str]] = {c: [] for c in need}
    lines: list[int] = []
    width = len(header)
    for row in reader:
        if not row:
            continue
        if len(row) != width:
            raise TraceError(name, f"expected {width} fields, found {len(row)}", reader.line_num)
        for c, i in zip(need, idx, strict=True):
            cols[c].append(row[i])
        lines.append(reader.line_num)
    if not lines:
        raise TraceError(name, "the trace has no rows", 2)
    return cols, lines


def int_column(values: list[Any], column: str, name: str, lines: list[int], *, min_value: int = 0,
               max_value: int = MAX_TOKENS_PER_REQUEST) -> np.ndarray:
    """Integer column; the first value that is not a whole number in range is an error.

    The range is ``[min_value, max_value]`` (by default at most
    :data:`~orcasim.workload.base.MAX_TOKENS_PER_REQUEST` tokens). CSV fields
    (strings) are parsed by numpy in one pass; JSON values must be numbers
    with no fractional part, never booleans or strings.
    """
    from_csv = isinstance(values[0], str)
    a = None
    try:
        if from_csv:
            a = np.array(values, dtype=np.int64)
        elif all(_json_int(v) for v in values):
            a = np.array([int(v) for v in values], dtype=np.int64)
    except (ValueError, OverflowError):
        a = None
    if a is None:
        _first_bad_int(values, from_csv, column, name, lines, min_value, max_value)
        raise TraceError(name, f"{column}: a value is out of range", lines[0])
    bad = np.flatnonzero((a < min_value) | (a > max_value))
    if bad.size:
        k = int(bad[0])
        raise TraceError(name, range_problem(column, int(a[k]), min_value, max_value), lines[k])
    return a


def _first_bad_int(values: list[Any], from_csv: bool, column: str, name: str, lines: list[int],
                   min_value: int, max_value: int) -> None:
    """Raise :class:`TraceError` at the first value that is not a whole number in range."""
    for v, line in zip(values, lines, strict=True):
        n = _as_int(v, from_csv)
        if n is None:
            raise TraceError(name, f"{column}: {show_value(v)} is not a whole number", line)
        if not min_value <= n <= max_value:
            raise TraceError(name, range_problem(column, n, min_value, max_value, v), line)


def range_problem(column: str, n: int, min_value: int, max_value: int, raw: Any = None) -> str:
    """Why ``n`` (read as ``raw``) is outside ``[min_value, max_value]``."""
    shown = show_value(n if raw is None or isinstance(raw, str) else raw)
    if n > max_value:
        return (f"{column}: {shown} is more than the limit of {max_value:,} tokens per "
                "request (MAX_TOKENS_PER_REQUEST)")
    return f"{column}: {shown} is {'negative' if n < 0 else f'below {min_value}'}"


def _as_int(v: Any, from_csv: bool) -> int | None:
    """``v`` as a whole number (a CSV string, or a JSON number), or ``None``."""
    if from_csv and isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    if _json_int(v):
        return int(v)
    return None


def _json_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


def show_value(v: Any, width: int = 40) -> str:
    """``repr(v)``, shortened to ``width`` characters for a one-line message."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**width:
        return f"a {len(str(abs(v)))}-digit number"
    text = repr(v)
    return text if len(text) <= width else f"{text[:width - 3]}..."


def float_column(values: list[Any], column: str, name: str, lines: list[int]) -> np.ndarray:
    """Column of finite numbers >= 0; the first that is not is an error naming its line."""
    try:
        a = np.array(values, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        for v, line in zip(values, lines, strict=True):
            try:
                float(v)
            except (ValueError, TypeError):
                raise TraceError(name, f"{column}: {show_value(v)} is not a number", line) from None
            except OverflowError:
                raise TraceError(name, f"{column}: {show_value(v)} is not a finite number >= 0",
                                 line) from None
        raise
    bad = np.flatnonzero(~np.isfinite(a) | (a < 0))
    if bad.size:
        k = int(bad[0])
        raise TraceError(name, f"{column}: {show_value(values[k])} is not a finite number >= 0",
                         lines[k])
    return a


def check_sorted(t: np.ndarray, column: str, name: str, lines: list[int]) -> None:
    bad = np.flatnonzero(np.diff(t) < 0)
    if bad.size:
        k = int(bad[0]) + 1
        raise TraceError(name, f"{column} goes back in time (the previous row is later): "
                         "the trace must be sorted by time", lines[k])


def json_row(raw: str, name: str, lineno: int) -> dict[str, Any]:
    """One JSON Lines row as an object; malformed or deeply nested JSON is a :class:`TraceError`."""
    try:
        row = json.loads(raw)
    except RecursionError:
        raise TraceError(name, "nested too deeply", lineno) from None
    except json.JSONDecodeError as err:
        raise TraceError(name, f"not a JSON object: {err.msg}", lineno) from None
    except ValueError:  # an integer of more digits than Python converts
        raise TraceError(name, "a number has too many digits", lineno) from None
    if not isinstance(row, dict):
        raise TraceError(name, "not a JSON object", lineno)
    return row
