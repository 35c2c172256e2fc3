"""Step-latency models: how long one engine step takes for a given batch.

A model is registered in :data:`orcasim.registry.latency_models` and maps a
:class:`~orcasim.plan.StepPlan` to seconds. Models are pure functions of the
plan: no state, no randomness, so a run is reproducible.
"""

from orcasim.latency.base import LatencyModel
from orcasim.latency.linear import ConstantLatency, LinearLatency

__all__ = ["ConstantLatency", "LatencyModel", "LinearLatency"]
