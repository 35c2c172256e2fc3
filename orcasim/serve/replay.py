"""The offline simulation of what a server served: the same arrivals and lengths, no clock.

A served run records each request's arrival (simulated seconds), prompt and
output lengths, and when its client went away (aborted requests). Replaying
those through :func:`~orcasim.simulation.run_variant` gives the schedule the
engine would have produced offline; when the server kept up with real time
(small lag) it is the served schedule itself, bit for bit. Comparing a load
tool's measured TTFT and inter-token latency with the replay's isolates what
HTTP adds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from orcasim.metrics.results import VariantResult
from orcasim.request import RequestState
from orcasim.scenario import VariantConfig
from orcasim.simulation import run_variant
from orcasim.workload.base import WorkloadArrays


def served_workload(columns: dict[str, Any]) -> WorkloadArrays:
    """The served requests as a workload: arrivals and lengths, and, for each aborted one,
    a client ``timeout`` at the time it was aborted (a disconnect or the server's stop)."""
    arrival = np.asarray(columns["arrival"], dtype=np.float64)
    aborted = np.asarray(columns["state"]) == int(RequestState.ABORTED)
    attrs: dict[str, list[Any]] = {}
    if aborted.any():
        finish = np.asarray(columns["finish"], dtype=np.float64)
        attrs["timeout"] = [float(f - a) if ab else None
                            for a, f, ab in zip(arrival, finish, aborted, strict=True)]
    return WorkloadArrays(arrival, np.asarray(columns["prompt_len"], dtype=np.int64),
                          np.asarray(columns["output_len"], dtype=np.int64), attrs=attrs)


def replay(cfg: VariantConfig, columns: dict[str, Any],
           seed: int | None = None) -> VariantResult:
    """``cfg`` simulated offline on the served requests ``columns`` (a served run's
    ``VariantResult.columns``, or :func:`read_served` of its ``requests.csv``)."""
    return run_variant(cfg, served_workload(columns), seed=seed)


def read_served(path: str | Path) -> dict[str, np.ndarray]:
    """The columns :func:`replay` needs from a served run's ``requests.csv``."""
    import pandas as pd

    df = pd.read_csv(path)
    cols = {c: df[c].to_numpy() for c in ("arrival", "prompt_len", "output_len", "first_token",
                                          "finish")}
    cols["state"] = np.array([int(RequestState[str(s).upper()]) for s in df["state"]],
                             dtype=np.int64)
    return cols
