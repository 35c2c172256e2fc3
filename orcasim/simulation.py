"""Wiring and running: one SimPy environment, one recorder and one generator per run.

:func:`run_variant` builds the model for one configuration (source, policy,
engine), runs it to the end and checks that every request that arrived ended
in exactly one final state. :func:`simulate` runs every variant of a scenario
on the same requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import simpy

from orcasim.admission.base import Gate
from orcasim.api_server import ApiServer
from orcasim.context import SchedulerContext
from orcasim.control import control_process, first_time
from orcasim.engine import Engine
from orcasim.errors import EXIT_USAGE, OrcasimError, ScenarioError, SimulationError
from orcasim.kv.config import MemoryOptions
from orcasim.latency.base import LatencyModel
from orcasim.metrics import row_spill
from orcasim.metrics.recorder import Recorder
from orcasim.metrics.results import Results, VariantResult
from orcasim.metrics.summary import summarize
from orcasim.policies.base import Policy
from orcasim.request import RequestState
from orcasim.scenario import Scenario, VariantConfig, load_scenario
from orcasim.source import make_source
from orcasim.spec import Spec
from orcasim.workload.base import WorkloadArrays

T = TypeVar("T")


def generate_workload(cfg: VariantConfig, seed: int | None = None) -> WorkloadArrays:
    """Draw ``cfg``'s requests with ``numpy.random.default_rng(seed)`` (default: the scenario's)."""
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    arrays = cfg.workload.create().generate(rng)
    arrays.check(f"workload ({cfg.workload.type})")
    return arrays


def workload_key(cfg: VariantConfig, seed: int) -> tuple[str, int]:
    """Variants with equal keys draw identical requests (equal workload sections and seed)."""
    return repr(cfg.workload.to_dict()), seed


def run_variant(
    cfg: VariantConfig,
    arrays: WorkloadArrays,
    *,
    trace_steps: bool = False,
    seed: int | None = None,
    on_model: Callable[[str, Model, int], None] | None = None,
) -> VariantResult:
    """Simulate one configuration on ``arrays`` and return its results.

    ``seed`` (default: the configuration's) seeds the policies' own generator
    (``ctx.rng``), which is independent of the workload's. ``on_model`` is
    called with the variant's name, its model and its request count before it
    runs (e.g. :meth:`orcasim.progress.Progress.watch`).
    """
    if cfg.cluster is not None:
        from orcasim.cluster.results import run_cluster_variant

        return run_cluster_variant(cfg, arrays, trace_steps=trace_steps, seed=seed)
    m = build_model(cfg, arrays, trace_steps=trace_steps, seed=seed)
    if on_model is not None:
        on_model(cfg.name, m, len(arrays))
    m.env.run()
    return variant_result(cfg, m, len(arrays), trace_steps=trace_steps)


def variant_result(cfg: VariantConfig, m: Model, num_requests: int, *,
                   trace_steps: bool = False) -> VariantResult:
    """The results of ``m``, a model of ``cfg`` that has run to its end with ``num_requests``
    requests: conservation checked, then summarised (also used by ``orcasim serve``).
    With the front end modelled, the columns also hold ``sent`` (when each client sent its
    request; the engine's ``arrival`` is later) and the summary the client's view."""
    env, ctx, rec, engine, policy = m.env, m.ctx, m.recorder, m.engine, m.policy
    check_conservation(cfg, ctx, rec, num_requests, env.now, engine)
    itl_times = rec.itl_times() if cfg.metrics.warmup or cfg.metrics.cooldown else None
    cols = rec.request_columns(take=True)  # rows and steps are held once from here on
    itl = rec.itl_samples(take=True)
    slo = cfg.metrics.slo.model_dump() if cfg.metrics.slo is not None else None
    summary = summarize(
        cols,
        itl,
        num_steps=rec.num_steps,
        sum_batch=rec.sum_batch,
        busy_time=engine.busy_time,
        slots=ctx.slots.capacity if ctx.slots.limited else None,
        slo=slo,
        warmup=cfg.metrics.warmup,
        cooldown=cfg.metrics.cooldown,
        itl_times=itl_times,
    )
    summary.update(ctx.preemption_summary())
    summary.update(ctx.kv.summary())
    summary.update(policy.summary_metrics())
    if cfg.frontend is not None and m.api is not None:
        cols["sent"] = m.api.sent[cols["id"]]
        summary.update(cfg.frontend.client_summary(cols, cols["sent"]))
    return VariantResult(
        name=cfg.name,
        config=cfg,
        columns=cols,
        itl=itl,
        series=rec.series_rows(),
        steps=rec.steps if trace_steps else None,
        summary=summary,
        kv_series=rec.kv.rows() if rec.kv is not None else None,
    )


@dataclass
class Model:
    """One configuration's SimPy model, built and ready to run."""

    env: simpy.Environment
    ctx: SchedulerContext
    recorder: Recorder
    policy: Policy
    latency: LatencyModel
    engine: Engine
    api: ApiServer | None = None  # the API server in front of the engine, when modelled


def build_model(
    cfg: VariantConfig,
    arrays: WorkloadArrays,
    *,
    trace_steps: bool = False,
    seed: int | None = None,
    env: simpy.Environment | None = None,
    api_server: bool = True,
) -> Model:
    """Build ``cfg``'s model on ``arrays``: KV memory, policy, clients, latency, admission,
    source, engine and scenario events, in that order.

    A configuration mistake is a :class:`ScenarioError` naming its section
    (``memory``, ``policy``, ``clients``, ``engine.latency``, ``admission.N``).
    ``orcasim validate`` builds the same model without running it. ``env``: the
    environment to build in (default a new :class:`simpy.Environment`; ``orcasim serve``
    passes a real-time one). ``api_server``: put the API server (:mod:`orcasim.api_server`)
    in front of the engine when the configuration asks for it (``orcasim serve`` is one).
    """
    env = simpy.Environment() if env is None else env
    rec = Recorder(trace_steps=trace_steps, series_capacity=cfg.output.series_capacity,
                   spill_rows=row_spill.SPILL_ROWS if len(arrays) > row_spill.STREAM_ABOVE
                   else None, expected_rows=len(arrays))  # long runs stream rows to disk
    ctx = SchedulerContext(env, rec, seed=cfg.seed if seed is None else seed)
    policy, latency = build_model_parts(cfg, cfg.policy, cfg.latency, cfg.memory, ctx, arrays)
    if cfg.admission or cfg.events:
        ctx.gate = Gate(make_controllers(cfg, ctx),
                        drain_at=first_time(cfg.events, "drain"),
                        stop_at=first_time(cfg.events, "hard_stop"))
    source = make_source(env, ctx, arrays)
    api = None
    limit = api_server_limit(cfg)
    if api_server and (cfg.frontend is not None or limit is not None):
        api = ApiServer(env, ctx, source, len(arrays), cfg.frontend, limit)
    engine = Engine(env, ctx, policy, latency)
    if cfg.events:
        env.process(control_process(env, engine, cfg.events))
    return Model(env, ctx, rec, policy, latency, engine, api)


def api_server_limit(cfg: VariantConfig) -> int | None:
    """The ``max_model_len`` the API server checks prompt + ``max_tokens`` against: the
    policy's, for a workload whose requests carry ``max_tokens`` (None: no check)."""
    if not getattr(cfg.workload.cls, "sends_max_tokens", False):
        return None
    return getattr(cfg.policy.params, "max_model_len", None)


def build_model_parts(
    cfg: VariantConfig, policy_spec: Spec, latency_spec: Spec, memory: MemoryOptions | None,
    ctx: SchedulerContext, arrays: WorkloadArrays, where: str = "",
) -> tuple[Policy, LatencyModel]:
    """One engine's KV memory, policy, clients and latency model, in that order, on ``ctx``.

    ``where`` prefixes the sections named in errors (a cluster group's path).
    """
    env, rec = ctx.env, ctx.recorder
    at = f"{where}." if where else ""
    if memory is not None:
        from orcasim.kv.pool import KVPool

        ctx.kv = _section(f"{at}memory", lambda: KVPool.from_options(env, memory, rec))
        if not getattr(policy_spec.cls, "models_kv_memory", False):
            raise ScenarioError(f"{at}memory", f"policy {policy_spec.type!r} does not allocate "
                                "KV memory (remove the memory section, or use a built-in policy)")
    policy = ctx.policy = _section(f"{at}policy", lambda: policy_spec.create(ctx))
    if cfg.clients is not None or "patience" in arrays.attrs or "timeout" in arrays.attrs:
        from orcasim.clients import Clients

        ctx.clients = Clients(ctx, cfg.clients)
    latency = _section(f"{at}engine.latency", latency_spec.create)
    return policy, latency


def _section(section: str, build: Callable[[], T]) -> T:
    """``build()``; a configuration error (not a :class:`ScenarioError`) names ``section``."""
    try:
        return build()
    except OrcasimError as err:
        if err.exit_code == EXIT_USAGE:  # names its own field or file already
            raise
        raise ScenarioError(section, str(err)) from None
    except ValueError as err:
        raise ScenarioError(section, str(err)) from None


def make_controllers(cfg: VariantConfig, ctx: SchedulerContext) -> list:
    """The variant's admission controllers; a configuration error names its entry."""
    out = []
    for i, spec in enumerate(cfg.admission):
        try:
            out.append(spec.create(ctx))
        except ScenarioError as err:
            raise ScenarioError(f"admission.{i}", err.message,
                                cfg.name and f"variant {cfg.name}") from None
    return out


def check_conservation(
    cfg: VariantConfig, ctx: SchedulerContext, rec: Recorder, num_requests: int, now: float,
    engine: Engine | None = None,
) -> None:
    """Every request arrived and ended in exactly one final state, and every slot and KV
    block came back; or a clear error."""
    waiting = len(ctx.waiting)
    running = sum(1 for _ in ctx.running)
    if waiting or running or rec.num_arrived != num_requests:
        ev = engine.waiting_on if engine is not None else None
        on = f" while it waits on {describe_event(ctx, ev)}" if ev is not None else ""
        raise SimulationError(
            f"variant {cfg.name!r}: the run stalled at t={now:.6g} with {waiting} "
            f"waiting and {running} running requests and nothing left to happen "
            f"({rec.num_arrived} of {num_requests} arrived, {rec.num_recorded} ended): "
            f"policy {cfg.policy.type!r} cannot make progress{on}"
        )
    held = ctx.slots.count - ctx.slots.reserved
    if held:
        raise SimulationError(f"variant {cfg.name!r}: {held} batch slots are still held after "
                              f"the run: policy {cfg.policy.type!r} lost track of them")
    leak = ctx.kv.leaked_blocks()
    if leak:
        raise SimulationError(f"variant {cfg.name!r}: {leak} KV blocks are still allocated "
                              f"after the run: policy {cfg.policy.type!r} did not free them")
    counts = rec.state_counts()
    ended = sum(counts.values())
    distinct = rec.num_distinct_ids()
    if ended != rec.num_arrived or distinct != ended:
        raise SimulationError(
            f"variant {cfg.name!r}: {rec.num_arrived} requests arrived but "
            f"{counts[RequestState.FINISHED]} finished + {counts[RequestState.REJECTED]} "
            f"rejected + {counts[RequestState.ABORTED]} aborted were recorded, for {distinct} "
            f"distinct requests: policy {cfg.policy.type!r} lost or double-counted requests"
        )


def describe_event(ctx: SchedulerContext, ev: object) -> str:
    """A readable name for an event a policy waits on (``ctx.slot_freed | a timer``)."""
    names = {id(ctx._arrival): "ctx.arrival", id(ctx.slots._freed): "ctx.slot_freed",
             id(ctx._step_end): "ctx.step_end", id(ctx._admitted): "ctx.admitted",
             id(getattr(ctx.kv, "_freed", None)): "ctx.kv.freed"}
    names.pop(id(None), None)
    parts = getattr(ev, "_events", None)
    if parts is not None:
        sep = " | " if isinstance(ev, simpy.AnyOf) else " & "
        return sep.join(describe_event(ctx, e) for e in parts)
    if isinstance(ev, simpy.Timeout):
        return "a timer"
    return names.get(id(ev), type(ev).__name__)


def simulate(
    scenario: Scenario | str | None = None,
    seed: int | None = None,
    *,
    variants: Sequence[str] | None = None,
    trace_steps: bool = False,
    workloads: Mapping[str, WorkloadArrays] | None = None,
    on_model: Callable[[str, Model, int], None] | None = None,
) -> Results:
    """Run a scenario's variants (all, or those named) with ``seed`` and return their results.

    Variants whose workload sections are equal share the same generated
    requests, so they are compared on identical input. ``workloads`` (variant
    name -> requests, drawn with the same seed, e.g. by ``orcasim validate``'s
    checks) saves drawing them again. ``on_model``: see :func:`run_variant`.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    chosen = scenario.variants
    if variants is not None:
        chosen = [scenario.variant(n) for n in variants]
    cache: dict[tuple[str, int], WorkloadArrays] = {}
    out: dict[str, VariantResult] = {}
    for cfg in chosen:
        s = cfg.seed if seed is None else seed
        key = workload_key(cfg, s)
        if key not in cache:
            given = workloads.get(cfg.name) if workloads is not None else None
            cache[key] = given if given is not None else generate_workload(cfg, s)
        out[cfg.name] = run_variant(cfg, cache[key], trace_steps=trace_steps, seed=s,
                                    on_model=on_model)
    return Results(scenario, out, seed=scenario.seed if seed is None else seed)
