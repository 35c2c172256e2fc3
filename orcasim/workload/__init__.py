"""Workloads: when requests arrive and how long their prompts and outputs are.

A workload turns a scenario section and one ``numpy.random.Generator`` into
:class:`WorkloadArrays` (arrival times, prompt and output lengths, optional
per-request attributes). Arrival processes and length distributions are
registered components, so a synthetic workload combines any of each; trace
files (``traces``) give real arrivals and lengths; closed-loop workloads
(``closed``) release requests when earlier ones end.
"""

from orcasim.workload import (
    arrivals,
    closed,
    distributions,
    explicit,
    inference_perf,
    lengths,
    synthetic,
    trace,
)
from orcasim.workload.base import Workload, WorkloadArrays

__all__ = [
    "Workload",
    "WorkloadArrays",
    "arrivals",
    "closed",
    "distributions",
    "explicit",
    "inference_perf",
    "lengths",
    "synthetic",
    "trace",
]
