"""orcasim: a discrete-event simulator for LLM inference serving.

Typical use from a notebook::

    import orcasim
    sc = orcasim.load_scenario()                       # the built-in seed study
    sc = sc.override({"policy.max_batch": 16})         # dotted-path overrides
    res = orcasim.simulate(sc, seed=1)                 # every variant, same requests
    res.summary["continuous"]["ttft_p99"]
    res.requests                                       # pandas DataFrame, one row per request
    df = orcasim.sweep(sc, {"workload.arrival.rate": [1, 2]}, seeds=5)  # one row per run

The names below are imported on first use (PEP 562), and the built-in
components register themselves the first time a registry is used: ``import
orcasim`` costs a few milliseconds, so a command or a plotting process loads
only the parts it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orcasim.errors import (
    FailedRunsWarning,
    OrcasimError,
    ScenarioError,
    SimulationError,
    UsageError,
)
from orcasim.registry import latency_models, lengths, workloads
from orcasim.registry import policies as policy_registry

if TYPE_CHECKING:
    from orcasim import latency, policies, routing, workload  # noqa: F401
    from orcasim.experiments.runner import sweep
    from orcasim.metrics.results import Results, VariantResult
    from orcasim.plan import StepPlan
    from orcasim.policies.base import DecodeOnlyPolicy, Policy, PolicyParams, TokenPolicy
    from orcasim.request import Request, RequestState
    from orcasim.scenario import Scenario, builtin_scenarios, load_scenario
    from orcasim.simulation import generate_workload, run_variant, simulate

register_policy = policy_registry.register

__version__ = "0.1.0"

#: public name -> the module it is imported from on first use
_LAZY = {
    "sweep": "orcasim.experiments.runner",
    "Results": "orcasim.metrics.results",
    "VariantResult": "orcasim.metrics.results",
    "StepPlan": "orcasim.plan",
    "DecodeOnlyPolicy": "orcasim.policies.base",
    "Policy": "orcasim.policies.base",
    "PolicyParams": "orcasim.policies.base",
    "TokenPolicy": "orcasim.policies.base",
    "Request": "orcasim.request",
    "RequestState": "orcasim.request",
    "Scenario": "orcasim.scenario",
    "builtin_scenarios": "orcasim.scenario",
    "load_scenario": "orcasim.scenario",
    "generate_workload": "orcasim.simulation",
    "run_variant": "orcasim.simulation",
    "simulate": "orcasim.simulation",
}
#: the packages of built-in components, reachable as attributes like the names above
_SUBPACKAGES = ("latency", "policies", "routing", "workload")


def __getattr__(name: str) -> Any:
    """Import a public name (or a built-in component package) on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"orcasim.{name}")
    else:
        raise AttributeError(f"module 'orcasim' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})


__all__ = [
    "DecodeOnlyPolicy",
    "FailedRunsWarning",
    "OrcasimError",
    "Policy",
    "PolicyParams",
    "Request",
    "RequestState",
    "Results",
    "Scenario",
    "ScenarioError",
    "SimulationError",
    "StepPlan",
    "TokenPolicy",
    "UsageError",
    "VariantResult",
    "__version__",
    "builtin_scenarios",
    "generate_workload",
    "latency_models",
    "lengths",
    "load_scenario",
    "policy_registry",
    "register_policy",
    "run_variant",
    "simulate",
    "sweep",
    "workloads",
]
