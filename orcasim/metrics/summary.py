"""Summary metrics of one run, with the definitions documented in docs/metrics.md.

- queue delay = first scheduled - arrival
- TTFT = first output token - arrival
- TPOT = (finish - first token) / (output tokens - 1), for requests with > 1 token
- ITL = gaps between consecutive tokens of a request, over all tokens
- E2E = finish - arrival
- throughput = output tokens / makespan (makespan: time of the last finish, from t = 0)

Latency metrics are over finished requests. Each gets ``_mean``, ``_p50``,
``_p90`` and ``_p99``; :func:`extra_percentiles` and :func:`merge_percentiles`
add others on request (``orcasim run --percentiles``) without touching these.

With a warm-up or cool-down (``metrics.warmup``/``metrics.cooldown``, fractions
of the arrival span ``[0, last arrival]``), the latency metrics and the SLO
metrics cover only the requests that arrived inside the window, and ITL only
the steps that ended inside it; counts, makespan and throughput stay whole-run.

Per-class and per-tenant keys, and counts of rejections and aborts by
reason, come from :mod:`orcasim.metrics.groups` (class latencies use the
same window).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from orcasim.metrics.groups import group_summary
from orcasim.metrics.stats import percentiles, weighted_mean, weighted_percentiles
from orcasim.request import RequestState

QUANTILES = (50, 90, 99)
LATENCY_METRICS = ("queue_delay", "ttft", "tpot", "itl", "e2e")


def _describe(prefix: str, x: np.ndarray, out: dict[str, float]) -> None:
    finite = np.isfinite(x)
    if not finite.all():
        x = x[finite]
    del finite
    out[f"{prefix}_mean"] = float(x.mean()) if x.size else float("nan")
    for q, v in zip(QUANTILES, percentiles(x, QUANTILES), strict=True):
        out[f"{prefix}_p{q}"] = v


def request_latencies(cols: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-request queue delay, TTFT, TPOT and E2E (NaN where undefined)."""
    arrival = cols["arrival"]
    first_token = cols["first_token"]
    finish = cols["finish"]
    n_out = cols["num_output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out > 1, (finish - first_token) / (n_out - 1), np.nan)
    return {
        "queue_delay": cols["first_scheduled"] - arrival,
        "ttft": first_token - arrival,
        "tpot": tpot,
        "e2e": finish - arrival,
    }


def slo_met(cols: dict[str, Any], slo: dict[str, float | None]) -> np.ndarray:
    """Boolean per request: finished and within every SLO bound given (ttft, tpot, e2e)."""
    lat = request_latencies(cols)
    ok = cols["state"] == int(RequestState.FINISHED)
    for key, bound in slo.items():
        if bound is not None:
            x = lat[key]
            ok &= ~(x > bound)  # NaN (undefined TPOT) counts as met
    return ok


def steady_state_window(
    arrival: np.ndarray, warmup: float, cooldown: float
) -> tuple[float, float] | None:
    """``(t0, t1)``: the arrival times kept by a warm-up/cool-down; None when both are 0.

    Both are fractions of the arrival span ``[0, last arrival]``.
    """
    if not (warmup or cooldown) or arrival.size == 0:
        return None
    end = float(arrival.max())
    return warmup * end, (1.0 - cooldown) * end


def summarize(
    cols: dict[str, Any],
    itl: tuple[np.ndarray, np.ndarray],
    *,
    num_steps: int,
    sum_batch: int,
    busy_time: float,
    slots: int | None = None,
    slo: dict[str, float | None] | None = None,
    warmup: float = 0.0,
    cooldown: float = 0.0,
    itl_times: np.ndarray | None = None,
) -> dict[str, float]:
    """All summary metrics of a run as a flat ``name -> value`` dict.

    ``warmup``/``cooldown`` (fractions of the arrival span) restrict the latency
    and SLO metrics to the steady-state window; ``itl_times`` (the step end of
    each ITL sample) is then needed to restrict ITL too.
    """
    state = cols["state"]
    finished = state == int(RequestState.FINISHED)
    window = steady_state_window(cols["arrival"], warmup, cooldown)
    out: dict[str, float] = {
        "num_requests": int(state.size),
        "num_finished": int(finished.sum()),
        "num_rejected": int((state == int(RequestState.REJECTED)).sum()),
        "num_aborted": int((state == int(RequestState.ABORTED)).sum()),
    }
    finish = cols["finish"]
    makespan = float(np.max(finish, where=np.isfinite(finish), initial=-np.inf))
    if makespan == -np.inf:  # no request finished
        makespan = float("nan")
    output_tokens = int(cols["num_output_tokens"].sum())
    out["makespan_s"] = makespan
    out["output_tokens"] = output_tokens
    out["throughput_tok_s"] = output_tokens / makespan if makespan > 0 else float("nan")
    out["requests_per_s"] = out["num_finished"] / makespan if makespan > 0 else float("nan")
    met = None
    span = makespan
    inside = np.ones(state.size, dtype=bool)
    values, counts = itl
    if window is not None:
        t0, t1 = window
        inside = (cols["arrival"] >= t0) & (cols["arrival"] <= t1)
        span = t1 - t0
        out["window_start_s"] = t0
        out["window_end_s"] = t1
        out["num_in_window"] = int(inside.sum())
        if itl_times is None:
            raise ValueError("a warm-up/cool-down window needs the ITL samples' times")
        keep = (itl_times >= t0) & (itl_times <= t1)
        values, counts = values[keep], counts[keep]
    if slo is not None and any(v is not None for v in slo.values()):
        met = slo_met(cols, slo) & inside
        num_fin = int((finished & inside).sum())
        out["goodput_req_s"] = int(met.sum()) / span if span > 0 else float("nan")
        out["slo_attainment"] = float(met.sum() / max(1, num_fin))
    finished = finished & inside
    lat = request_latencies(cols)
    for name in ("queue_delay", "ttft", "tpot"):
        _describe(name, lat[name][finished], out)
    out["itl_mean"] = weighted_mean(values, counts)
    for q, v in zip(QUANTILES, weighted_percentiles(values, counts, QUANTILES), strict=True):
        out[f"itl_p{q}"] = v
    _describe("e2e", lat["e2e"][finished], out)
    out["num_steps"] = num_steps
    out["seq_steps"] = sum_batch
    out["mean_batch_size"] = sum_batch / num_steps if num_steps else float("nan")
    out["busy_fraction"] = busy_time / makespan if makespan > 0 else float("nan")
    if slots:
        out["slot_utilisation"] = sum_batch / (num_steps * slots) if num_steps else float("nan")
    if out["num_rejected"] or out["num_aborted"] or not all(
            _all_none(cols[c]) for c in ("cls", "tenant", "reason")):
        out.update(group_summary(cols, lat, makespan, met, inside))
    return out


def _all_none(col: Any) -> bool:
    """Whether a string column holds no value (then it adds no group keys to a summary)."""
    return isinstance(col, list) and col.count(None) == len(col)


def percentile_label(q: float) -> str:
    """``q`` as vLLM writes it in a key: ``99`` for 99 or 99.0, ``99.9`` for 99.9."""
    return str(int(q)) if float(q).is_integer() else str(q)


def percentile_suffix(q: float) -> str:
    """The summary-key suffix of percentile ``q``: ``p99``, ``p99_9``.

    The decimal point becomes ``_`` because ``.`` separates the parts of the
    ``class.<name>.<metric>`` keys, which are split at their last dot.
    """
    return "p" + percentile_label(q).replace(".", "_")


def extra_percentiles(
    cols: dict[str, Any],
    itl: tuple[np.ndarray, np.ndarray],
    qs: Sequence[float],
    *,
    warmup: float = 0.0,
    cooldown: float = 0.0,
) -> dict[str, dict[float, float]]:
    """``prefix -> {q: value}`` for the percentiles in ``qs`` that the summary lacks.

    Covers the run-wide latencies and the per-class ones (``class.<name>.ttft``
    ...), over the same requests as :func:`summarize`. ITL is left out under a
    warm-up/cool-down window: the results do not keep the ITL samples' times
    that would restrict it to the window.
    """
    extra = [float(q) for q in dict.fromkeys(qs) if q not in QUANTILES]
    if not extra:
        return {}
    finished = cols["state"] == int(RequestState.FINISHED)
    window = steady_state_window(cols["arrival"], warmup, cooldown)
    if window is not None:
        t0, t1 = window
        finished &= (cols["arrival"] >= t0) & (cols["arrival"] <= t1)
    lat = request_latencies(cols)
    out: dict[str, dict[float, float]] = {}
    for name in ("queue_delay", "ttft", "tpot", "e2e"):
        out[name] = dict(zip(extra, percentiles(lat[name][finished], extra), strict=True))
    if window is None:
        out["itl"] = dict(zip(extra, weighted_percentiles(*itl, extra), strict=True))
    for cls in dict.fromkeys(c for c in cols["cls"] if c is not None):
        member = finished & np.array([c == cls for c in cols["cls"]], dtype=bool)
        for name in ("queue_delay", "ttft", "tpot", "e2e"):
            values = percentiles(lat[name][member], extra)
            out[f"class.{cls}.{name}"] = dict(zip(extra, values, strict=True))
    return out


def merge_percentiles(
    summary: dict[str, float], extra: dict[str, dict[float, float]]
) -> dict[str, float]:
    """``summary`` with the ``extra`` percentiles inserted among their siblings, in order of q.

    ``ttft_p95`` lands between ``ttft_p90`` and ``ttft_p99`` and ``ttft_p99_9``
    after ``ttft_p99``, so summary.json reads in order; existing keys keep
    their values and relative order.
    """
    pending = {prefix: sorted(qv.items()) for prefix, qv in extra.items()}
    defaults = {percentile_suffix(q): float(q) for q in QUANTILES}
    out: dict[str, float] = {}

    def flush(prefix: str, below: float) -> None:
        todo = pending.get(prefix, [])
        while todo and todo[0][0] < below:
            q, v = todo.pop(0)
            out[f"{prefix}_{percentile_suffix(q)}"] = v

    for key, value in summary.items():
        prefix, sep, suffix = key.rpartition("_")
        q = defaults.get(suffix) if sep else None
        if q is not None:
            flush(prefix, q)
        out[key] = value
        if q == max(QUANTILES):
            flush(prefix, float("inf"))
    for prefix in pending:
        flush(prefix, float("inf"))
    return out
