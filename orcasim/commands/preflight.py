"""Every check a run makes before its first step, without simulating.

:func:`check_scenario` builds each variant's components through their public
APIs, in the order :func:`orcasim.simulation.run_variant` builds them (KV
memory, policy, clients, latency model, admission controllers), times a
one-sequence step and draws the workload. ``orcasim validate`` runs it on
every variant, and ``orcasim run`` before it simulates, so a configuration
``validate`` accepts is one ``run`` accepts, and a mistake in the last
variant is reported before the first one runs. Every problem is a
:class:`~orcasim.errors.ScenarioError` naming the variant and the section.
"""

from __future__ import annotations

import math
from typing import Any

from orcasim.errors import EXIT_USAGE, OrcasimError, ScenarioError, SimulationError
from orcasim.scenario import Scenario, VariantConfig
from orcasim.simulation import workload_key
from orcasim.workload.base import WorkloadArrays

#: the step timed to check a latency model: one sequence decoding after a short prompt
PROBE_SEQS, PROBE_KV_TOKENS = 1, 16


class _Problem(Exception):
    """A check failed in ``section``: ``message`` says why."""

    def __init__(self, section: str, message: str) -> None:
        super().__init__(section, message)
        self.section = section
        self.message = message


def check_scenario(
    sc: Scenario, seed: int | None = None, variants: list[str] | None = None
) -> dict[str, WorkloadArrays]:
    """Check the named variants (default: all) of ``sc``; return each one's workload.

    ``seed`` overrides the variants' own seeds for the workload, as ``run --seed`` does.
    """
    chosen = [sc.variant(n) for n in variants] if variants else sc.variants
    out: dict[str, WorkloadArrays] = {}
    cache: dict[tuple[str, int], WorkloadArrays] = {}
    for cfg in chosen:
        s = cfg.seed if seed is None else seed
        key = workload_key(cfg, s)
        try:
            if key not in cache:
                cache[key] = _workload(cfg, s)
            _check_variant(cfg, cache[key])
        except _Problem as p:
            prefix = f"variants.{cfg.name}: " if sc.model.variants else ""
            raise ScenarioError(f"{prefix}{p.section}", p.message, sc.source) from None
        out[cfg.name] = cache[key]
    return out


def _check_variant(cfg: VariantConfig, arrays: WorkloadArrays) -> None:
    """Build ``cfg``'s model on ``arrays`` as a run does (without running it) and time a
    step; raise :class:`_Problem` for the first part that fails."""
    from orcasim.simulation import build_model

    try:
        if cfg.cluster is not None:
            from orcasim.cluster.model import build_cluster_model, one_per_group

            latencies = [r.latency for r in build_cluster_model(one_per_group(cfg),
                                                                arrays).replicas]
        else:
            latencies = [build_model(cfg, arrays).latency]
    except ScenarioError as err:
        raise _scenario_problem(err, "policy") from None
    for latency in latencies:
        _check_latency(latency)


def _scenario_problem(err: ScenarioError, section: str) -> _Problem:
    if err.source and not err.source.startswith("variant "):  # a file of its own (a trace)
        return _Problem(section, str(err))
    return _Problem(err.field or section, err.message)


def _check_latency(model: Any) -> None:
    """The latency model times a one-sequence step as positive and finite."""
    from orcasim.plan import StepPlan

    plan = StepPlan(PROBE_SEQS, PROBE_KV_TOKENS)
    try:
        raw = model.step_time(plan)
    except ScenarioError as err:
        raise _scenario_problem(err, "engine.latency") from None
    except (OrcasimError, ValueError) as err:
        raise _Problem("engine.latency", str(err)) from None
    try:
        t = float(raw)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise _Problem("engine.latency", f"a step of {PROBE_SEQS} sequence with "
                       f"{PROBE_KV_TOKENS} KV tokens takes {raw!r} s; a step time must be "
                       "positive and finite")


def _workload(cfg: VariantConfig, seed: int) -> WorkloadArrays:
    """Draw ``cfg``'s requests as a run does (trace files read, windows checked)."""
    from orcasim.simulation import generate_workload

    try:
        return generate_workload(cfg, seed)
    except ScenarioError as err:
        raise _scenario_problem(err, "workload") from None
    except OrcasimError as err:
        if isinstance(err, SimulationError) or err.exit_code == EXIT_USAGE:
            raise  # a trace file's own error names the file and the line
        raise _Problem("workload", str(err)) from None
    except ValueError as err:
        raise _Problem("workload", str(err)) from None
