"""A cluster run's results: per-replica and cluster-wide summaries, one request table.

The cluster's summary has every single-engine metric computed over all
requests, plus ``num_replicas``, ``gpu_seconds`` (replicas x makespan: every
replica is up for the whole run), ``gpu_busy_seconds``, ``load_imbalance``
(mean over routing decisions of max / mean outstanding requests per
replica) and the cluster prefix-cache hit rate. Each replica's own summary
appears under ``replica.<name>.<metric>`` keys (like the per-class ones), and
the request table has a ``replica`` column (empty for requests the router
rejected).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orcasim.cluster.model import (
    ClusterModel,
    Replica,
    build_cluster_model,
    check_cluster_conservation,
)
from orcasim.metrics.results import VariantResult
from orcasim.metrics.summary import summarize
from orcasim.scenario import VariantConfig
from orcasim.workload.base import WorkloadArrays

#: per-replica metrics kept in the cluster summary (``replica.<name>.<metric>``)
REPLICA_METRICS = (
    "num_requests", "num_finished", "num_rejected", "num_aborted", "routed_share",
    "throughput_tok_s", "queue_delay_p50", "queue_delay_p99", "ttft_p50", "ttft_p99",
    "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "busy_fraction", "mean_batch_size",
    "num_preemptions", "kv_peak_usage", "kv_capacity_tokens", "prefix_cache_hit_rate",
)
#: engine-side keys summed over replicas (counts, bytes, seconds, capacities)
_SUM_KEYS = ("num_preemptions", "num_recomputed_tokens", "kv_num_blocks", "kv_capacity_tokens",
             "num_swap_outs", "swapped_bytes", "swap_time_s", "prefix_cache_hit_tokens")


def run_cluster_variant(cfg: VariantConfig, arrays: WorkloadArrays, *, trace_steps: bool = False,
                        seed: int | None = None) -> VariantResult:
    """Simulate ``cfg``'s cluster on ``arrays``, check conservation, summarise."""
    m = build_cluster_model(cfg, arrays, trace_steps=trace_steps, seed=seed)
    m.env.run()
    check_cluster_conservation(cfg, m, len(arrays))
    return cluster_result(cfg, m, trace_steps)


def _engine_summary(r: Replica) -> dict[str, Any]:
    """Preemptions, KV memory and policy metrics of the replica (over all its engines)."""
    parts = []
    for ctx, policy in [*((c, p) for c, p, _ in r.past), (r.ctx, r.policy)]:
        out: dict[str, Any] = dict(ctx.preemption_summary())
        out.update(ctx.kv.summary())
        out.update(policy.summary_metrics())
        parts.append(out)
    return parts[0] if len(parts) == 1 else _combine_engine(parts)


def _summarize(cfg: VariantConfig, cols: dict[str, Any], itl: tuple[np.ndarray, np.ndarray],
               itl_times: np.ndarray | None, num_steps: int, sum_batch: int, busy: float,
               slots: int | None) -> dict[str, Any]:
    m = cfg.metrics
    return summarize(cols, itl, num_steps=num_steps, sum_batch=sum_batch, busy_time=busy,
                     slots=slots, slo=m.slo.model_dump() if m.slo is not None else None,
                     warmup=m.warmup, cooldown=m.cooldown, itl_times=itl_times)


def _slots(r: Replica) -> int | None:
    return r.ctx.slots.capacity if r.ctx.slots.limited else None


def cluster_result(cfg: VariantConfig, m: ClusterModel, trace_steps: bool) -> VariantResult:
    """The cluster's :class:`VariantResult` (see the module docstring for what it holds)."""
    windowed = bool(cfg.metrics.warmup or cfg.metrics.cooldown)
    reps = m.replicas
    n = len(reps)
    parts: list[tuple[str | None, dict[str, Any]]] = []
    per: list[dict[str, Any]] = []
    engine: list[dict[str, Any]] = []
    itls, times = [], []
    for r in reps:
        rec = r.recorder
        cols = rec.request_columns()
        itl = rec.itl_samples()
        t = rec.itl_times() if windowed else None
        busy = r.busy_time
        s = _summarize(cfg, cols, itl, t, rec.num_steps, rec.sum_batch, busy, _slots(r))
        engine.append(_engine_summary(r))
        s.update(engine[-1])
        per.append(s)
        parts.append((r.name, cols))
        itls.append(itl)
        if t is not None:
            times.append(t)
    parts.append((None, m.router.recorder.request_columns()))
    cols = _merge_columns(parts)
    if m.disagg is not None:
        cols.update(m.disagg.request_columns(cols["id"]))
    itl = (np.concatenate([g for g, _ in itls]), np.concatenate([c for _, c in itls]))
    slot_caps = {_slots(r) for r in reps}
    busy_total = sum(r.busy_time for r in reps)
    summary = _summarize(cfg, cols, itl, np.concatenate(times) if windowed else None,
                         sum(r.recorder.num_steps for r in reps),
                         sum(r.recorder.sum_batch for r in reps), busy_total / n,
                         slot_caps.pop() if len(slot_caps) == 1 else None)
    summary.update(_combine_engine(engine) if n > 1 else engine[0])
    makespan = summary["makespan_s"]
    summary["num_replicas"] = n
    summary["gpu_seconds"] = n * makespan if makespan == makespan else float("nan")
    summary["gpu_busy_seconds"] = busy_total
    summary["load_imbalance"] = m.router.mean_imbalance
    if m.faults is not None:
        summary.update(m.faults.summary())
    if m.disagg is not None:
        summary.update(m.disagg.summary())
        # cache hits count where prompts are computed: decode replicas' hits are transfers
        pre = [e for r, e in zip(reps, engine, strict=True) if r.group.role == "prefill"]
        hits = sum(e.get("prefix_cache_hit_tokens", 0) for e in pre)
        prompt = sum(e["prefix_cache_hit_tokens"] / e["prefix_cache_hit_rate"] for e in pre
                     if e.get("prefix_cache_hit_rate"))
        summary["prefix_cache_hit_tokens"] = hits
        summary["prefix_cache_hit_rate"] = hits / prompt if prompt else 0.0
    if "goodput_req_s" in summary:
        summary["goodput_req_s_per_gpu"] = summary["goodput_req_s"] / n
    if m.scaler is not None:
        summary.update(m.scaler.summary(makespan if makespan == makespan else 0.0))
    total_routed = sum(m.router.routed)
    for r, s in zip(reps, per, strict=True):
        s["routed_share"] = m.router.routed[r.index] / total_routed if total_routed else 0.0
        for key in REPLICA_METRICS:
            if key in s:
                summary[f"replica.{r.name}.{key}"] = s[key]
    series, kv_series = _series(reps)
    return VariantResult(
        name=cfg.name, config=cfg, columns=cols, itl=itl, series=series,
        steps=_steps(reps) if trace_steps else None, summary=summary, kv_series=kv_series,
        routing=_routing_log(m) if m.router.log is not None else None,
        scaling=_scaling(m) if m.scaler is not None else None,
    )


def _merge_columns(parts: list[tuple[str | None, dict[str, Any]]]) -> dict[str, Any]:
    """Every part's request columns in one table sorted by request id, with ``replica``."""
    keys = list(parts[0][1])
    ids = np.concatenate([p["id"] for _, p in parts])
    order = np.argsort(ids, kind="stable")
    out: dict[str, Any] = {}
    for k in keys:
        first = parts[0][1][k]
        if isinstance(first, np.ndarray):
            out[k] = np.concatenate([p[k] for _, p in parts])[order]
        else:
            flat = [x for _, p in parts for x in p[k]]
            out[k] = [flat[i] for i in order.tolist()]
    names = [name for name, p in parts for _ in range(len(p["id"]))]
    out["replica"] = [names[i] for i in order.tolist()]
    return out


def _combine_engine(per: list[dict[str, Any]]) -> dict[str, Any]:
    """Engine-side metrics of the cluster: sums of counts, the peak of peaks, mean shares."""
    out: dict[str, Any] = {}
    keys = [k for k in per[0] if all(k in s for s in per)]
    for k in keys:
        vals = [s[k] for s in per]
        if k in _SUM_KEYS or k.startswith("num_preemptions_"):
            out[k] = sum(vals)
        elif k.endswith("_peak_usage"):
            out[k] = max(vals)
        elif k == "kv_block_size":
            out[k] = vals[0] if len(set(vals)) == 1 else float("nan")
        elif all(isinstance(v, (int, float)) for v in vals):
            finite = [float(v) for v in vals if v == v]
            out[k] = sum(finite) / len(finite) if finite else float("nan")
    if "prefix_cache_hit_tokens" in out:
        hits = out["prefix_cache_hit_tokens"]
        prompt = sum(s["prefix_cache_hit_tokens"] / s["prefix_cache_hit_rate"]
                     for s in per if s.get("prefix_cache_hit_rate"))
        out["prefix_cache_hit_rate"] = hits / prompt if prompt else 0.0
    return out


def _series(reps: list[Replica]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """One replica: its own series; several: every replica's rows with a ``replica`` column
    (its index in the step series, its name in the KV series)."""
    rows = [r.recorder.series_rows() for r in reps]
    kv = [r.recorder.kv.rows() if r.recorder.kv is not None else None for r in reps]
    if len(reps) == 1:
        return rows[0], kv[0]
    series = {k: np.concatenate([s[k] for s in rows]) for k in rows[0]}
    series["replica"] = np.concatenate([np.full(len(next(iter(s.values()))), i)
                                        for i, s in enumerate(rows)])
    kv_rows = [(r.name, k) for r, k in zip(reps, kv, strict=True) if k is not None]
    if not kv_rows:
        return series, None
    kv_series = {k: np.concatenate([s[k] for _, s in kv_rows]) for k in kv_rows[0][1]}
    kv_series["replica"] = np.concatenate([np.full(len(s["t_start"]), name, dtype=object)
                                           for name, s in kv_rows])
    return series, kv_series


def _steps(reps: list[Replica]) -> list[tuple[int, float, float, tuple[str | None, ...]]]:
    """Every replica's traced steps, labelled ``name:request``, ordered by start time."""
    if len(reps) == 1:
        return reps[0].recorder.steps
    out = []
    for r in reps:
        for i, t0, t1, labels in r.recorder.steps:
            out.append((i, t0, t1, tuple(None if x is None else f"{r.name}:{x}"
                                         for x in labels)))
    out.sort(key=lambda s: (s[1], s[2]))
    return [(k, t0, t1, labels) for k, (_, t0, t1, labels) in enumerate(out)]


def _routing_log(m: ClusterModel) -> dict[str, Any]:
    log = m.router.log or []
    names = [r.name for r in m.replicas]
    return {"time": np.array([t for t, _, _, _ in log], dtype=np.float64),
            "id": np.array([i for _, i, _, _ in log], dtype=np.int64),
            "replica": [names[k] for _, _, k, _ in log],
            "scores": [s for _, _, _, s in log]}


def _scaling(m: ClusterModel) -> dict[str, Any]:
    tl = m.scaler.timeline
    return {"time": np.array([t for t, _, _ in tl], dtype=np.float64),
            "replica": [r for _, r, _ in tl], "event": [e for _, _, e in tl]}
