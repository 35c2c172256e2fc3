"""Workloads: when requests arrive and how long their prompts and outputs are.

A workload turns a scenario section and one ``numpy.random.Generator`` into
:class:`WorkloadArrays` (arrival times, prompt and output lengths, optional
names, priorities, tenants). Arrival processes and length distributions are
registered components, so a synthetic workload combines any of each.
"""

from orcasim.workload import distributions, explicit, synthetic
from orcasim.workload.base import Workload, WorkloadArrays

__all__ = ["Workload", "WorkloadArrays", "distributions", "explicit", "synthetic"]
