"""orcasim: a discrete-event simulator for LLM inference serving.

Typical use from a notebook::

    import orcasim
    sc = orcasim.load_scenario()                       # the built-in seed study
    sc = sc.override({"policy.max_batch": 16})         # dotted-path overrides
    res = orcasim.simulate(sc, seed=1)                 # every variant, same requests
    res.summary["continuous"]["ttft_p99"]
    res.requests                                       # pandas DataFrame, one row per request
    df = orcasim.sweep(sc, {"workload.arrival.rate": [1, 2]}, seeds=5)  # one row per run
"""

from orcasim import latency, policies, routing, workload  # noqa: F401  (register built-ins)
from orcasim.errors import (
    FailedRunsWarning,
    OrcasimError,
    ScenarioError,
    SimulationError,
    UsageError,
)
from orcasim.experiments.runner import sweep
from orcasim.metrics.results import Results, VariantResult
from orcasim.plan import StepPlan
from orcasim.policies.base import DecodeOnlyPolicy, Policy, PolicyParams, TokenPolicy
from orcasim.registry import latency_models, lengths, workloads
from orcasim.registry import policies as policy_registry
from orcasim.request import Request, RequestState
from orcasim.scenario import Scenario, builtin_scenarios, load_scenario
from orcasim.simulation import generate_workload, run_variant, simulate

register_policy = policy_registry.register

__version__ = "0.1.0"

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
