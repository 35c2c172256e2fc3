"""Step-latency models: how long one engine step takes for a given batch.

A model is registered in :data:`orcasim.registry.latency_models` and maps a
:class:`~orcasim.plan.StepPlan` to seconds. Models are pure functions of the
plan: no state, no randomness, so a run is reproducible. Built in: ``linear``
and ``constant`` (:mod:`.linear`), ``roofline`` (:mod:`.roofline`, from model
and GPU presets), ``table`` (:mod:`.table`, measured step times) and ``profile``
(:mod:`.profile`, per-operator GPU profiles).
"""

from orcasim.latency.base import LatencyModel
from orcasim.latency.linear import ConstantLatency, LinearLatency
from orcasim.latency.profile import ProfileLatency
from orcasim.latency.roofline import RooflineLatency
from orcasim.latency.table import TableLatency

__all__ = [
    "ConstantLatency",
    "LatencyModel",
    "LinearLatency",
    "ProfileLatency",
    "RooflineLatency",
    "TableLatency",
]
