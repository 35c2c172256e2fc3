"""Measured step times: the CSV read by the ``table`` latency model and ``orcasim calibrate``.

One row per measured step::

    batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds
    1,0,1,512,0.0071
    8,0,8,4096,0.0079

``batch_size`` is the sequences in the step, ``prefill_tokens`` and
``decode_tokens`` the prompt and generated-token positions it computed,
``kv_tokens`` the cached tokens it read (the quantities of a
:class:`~orcasim.plan.StepPlan`), ``seconds`` its duration. Extra columns
are ignored. Every row must be complete, numeric and non-negative, the
counts at most :data:`MAX_STEP_COUNT`, and ``seconds`` in ``(0,``
:data:`~orcasim.latency.base.MAX_STEP_SECONDS` ``]``; a bad row is an
error naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orcasim.latency.base import MAX_STEP_SECONDS
from orcasim.plan import StepPlan
from orcasim.workload.base import MAX_REQUESTS_PER_RUN, MAX_TOKENS_PER_REQUEST
from orcasim.workload.traces import ENCODING, TraceError, csv_columns, float_column

#: the largest count a measured step may have: every token of the largest run
MAX_STEP_COUNT = float(MAX_REQUESTS_PER_RUN) * MAX_TOKENS_PER_REQUEST

FEATURES = ("batch_size", "prefill_tokens", "decode_tokens", "kv_tokens")
COLUMNS = (*FEATURES, "seconds")


@dataclass(frozen=True)
class Measurements:
    """Measured steps: ``x`` is ``(rows, 4)`` in :data:`FEATURES` order, ``seconds`` ``(rows,)``."""

    source: str
    x: np.ndarray
    seconds: np.ndarray

    def __len__(self) -> int:
        return len(self.seconds)

    def plans(self) -> list[StepPlan]:
        """Each row as a step plan (aggregates only), for evaluating a latency model on it."""
        return [StepPlan(int(b), int(kv), int(p), int(d)) for b, p, d, kv in self.x.tolist()]


def load_measurements(path: str | Path) -> Measurements:
    """Read a measured-steps CSV; a missing file or malformed row is a :class:`TraceError`."""
    name = str(path)
    try:
        text = Path(path).expanduser().read_text(encoding=ENCODING)
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(name, f"cannot read: {getattr(err, 'strerror', None) or err}") from None
    cols, lines = csv_columns(text, name, COLUMNS)
    x = np.column_stack([float_column(cols[c], c, name, lines) for c in FEATURES])
    seconds = float_column(cols["seconds"], "seconds", name, lines)
    bad = np.flatnonzero(seconds <= 0)
    if bad.size:
        raise TraceError(name, f"seconds: {cols['seconds'][bad[0]]!r} must be > 0",
                         lines[bad[0]])
    bad = np.flatnonzero(seconds > MAX_STEP_SECONDS)
    if bad.size:
        raise TraceError(name, f"seconds: {cols['seconds'][bad[0]]!r} is more than the limit "
                         f"of {MAX_STEP_SECONDS:g} s per step (MAX_STEP_SECONDS)", lines[bad[0]])
    for j, col in enumerate(FEATURES):
        bad = np.flatnonzero(x[:, j] > MAX_STEP_COUNT)
        if bad.size:
            raise TraceError(name, f"{col}: {cols[col][bad[0]]!r} is more than the limit of "
                             f"{MAX_STEP_COUNT:g}", lines[bad[0]])
    bad = np.flatnonzero(x[:, 0] < 1)
    if bad.size:
        raise TraceError(name, "batch_size must be >= 1", lines[bad[0]])
    return Measurements(name, x, seconds)
