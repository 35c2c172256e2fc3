"""A measured vLLM serving run: its engine arguments and per-request timestamps.

A run directory (the format of LLMServingSim's ``bench`` recorder) holds:

- ``meta.json``: ``engine_kwargs`` (vLLM's engine arguments: ``model``,
  ``tensor_parallel_size``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len``, ``block_size``, ``enable_prefix_caching``,
  ``gpu_memory_utilization``, ``num_gpu_blocks`` when recorded, ...) and
  ``num_requests``;
- ``requests.jsonl``: one request per line with ``request_id``,
  ``input_toks``, ``output_toks``, ``queued_ts``, ``first_token_ts`` and
  ``last_token_ts`` (engine-side monotonic clock, seconds);
- ``timeseries.csv`` (optional): ``t``, ``running``, ``waiting`` once a second.

The measured latencies follow vLLM's own definitions: TTFT = first_token_ts -
queued_ts, TPOT = (last_token_ts - first_token_ts) / (output_toks - 1) and E2E =
last_token_ts - queued_ts. They are only ever compared with predictions,
never used to make them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orcasim.errors import UsageError

#: keys every line of requests.jsonl must have
REQUEST_KEYS = ("request_id", "input_toks", "output_toks", "queued_ts", "first_token_ts",
                "last_token_ts")


@dataclass
class MeasuredRun:
    """One run directory, read and checked."""

    directory: Path
    meta: dict[str, Any]
    request_ids: list[str]
    input_toks: np.ndarray
    output_toks: np.ndarray
    queued: np.ndarray
    first_token: np.ndarray
    last_token: np.ndarray
    timeseries: dict[str, np.ndarray] | None = field(default=None)

    @property
    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM's engine arguments of the run (``{}`` when not recorded)."""
        kw = self.meta.get("engine_kwargs")
        return kw if isinstance(kw, dict) else {}

    def latencies_ms(self) -> dict[str, np.ndarray]:
        """Per-request TTFT, TPOT and E2E in milliseconds (TPOT NaN for one-token outputs)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.output_toks > 1, (self.last_token - self.first_token)
                            / (self.output_toks - 1), np.nan)
        return {"ttft": (self.first_token - self.queued) * 1e3, "tpot": tpot * 1e3,
                "e2e": (self.last_token - self.queued) * 1e3}


def _fail(path: Path, message: str, line: int | None = None) -> UsageError:
    at = f":{line}" if line is not None else ""
    return UsageError(f"{path}{at}: {message}")


def load_run(directory: Path) -> MeasuredRun:
    """Read ``meta.json``, ``requests.jsonl`` and (if present) ``timeseries.csv`` of a run.

    A missing file, malformed JSON, a missing key or a value that is not a
    finite number is a one-line :class:`UsageError` naming the file and line.
    """
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory (the measured run: meta.json and "
                         "requests.jsonl)")
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise _fail(meta_path, "missing (the run's engine arguments)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _fail(meta_path, f"not valid JSON ({err.__class__.__name__})") from None
    if not isinstance(meta, dict):
        raise _fail(meta_path, "not a JSON object")
    kw = meta.get("engine_kwargs", {})
    if not isinstance(kw, dict):
        raise _fail(meta_path, "engine_kwargs is not an object")
    req_path = directory / "requests.jsonl"
    if not req_path.is_file():
        raise _fail(req_path, "missing (the measured requests)")
    rows = _request_rows(req_path)
    run = MeasuredRun(
        directory=directory, meta=meta,
        request_ids=[str(r["request_id"]) for r in rows],
        input_toks=np.array([r["input_toks"] for r in rows], dtype=np.int64),
        output_toks=np.array([r["output_toks"] for r in rows], dtype=np.int64),
        queued=np.array([r["queued_ts"] for r in rows], dtype=np.float64),
        first_token=np.array([r["first_token_ts"] for r in rows], dtype=np.float64),
        last_token=np.array([r["last_token_ts"] for r in rows], dtype=np.float64),
    )
    n = meta.get("num_requests")
    if isinstance(n, int) and n != len(rows):
        raise _fail(req_path, f"{len(rows)} requests, but meta.json says num_requests {n}")
    ts = directory / "timeseries.csv"
    if ts.is_file():
        run.timeseries = _timeseries(ts)
    return run


def _request_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            raise _fail(path, f"not a JSON object: {err.msg}", lineno) from None
        if not isinstance(row, dict):
            raise _fail(path, "not a JSON object", lineno)
        for key in REQUEST_KEYS:
            if key not in row:
                raise _fail(path, f"missing key {key!r}", lineno)
        for key in REQUEST_KEYS[1:]:
            v = row[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise _fail(path, f"{key}: {v!r} is not a finite number", lineno)
        if type(row["output_toks"]) is not int or row["output_toks"] < 1:
            raise _fail(path, "output_toks must be a whole number >= 1", lineno)
        if not row["queued_ts"] <= row["first_token_ts"] <= row["last_token_ts"]:
            raise _fail(path, "timestamps out of order (queued_ts <= first_token_ts <= "
                        "last_token_ts)", lineno)
        rows.append(row)
    if not rows:
        raise _fail(path, "no requests")
    return rows


def _timeseries(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        cols: dict[str, list[float]] = {"t": [], "running": [], "waiting": []}
        for c in cols:
            if c not in (reader.fieldnames or []):
                raise _fail(path, f"missing column {c!r}", 1)
        for lineno, row in enumerate(reader, start=2):
            for c, values in cols.items():
                try:
                    values.append(float(row[c]))
                except (TypeError, ValueError):
                    raise _fail(path, f"{c}: {row[c]!r} is not a number", lineno) from None
    return {c: np.array(v) for c, v in cols.items()}
