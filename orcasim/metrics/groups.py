"""Summary metrics by request class and tenant, rejections by reason, and Jain's index.

These keys are added to a run's flat summary only when they apply, so runs
without classes, tenants, rejections or aborts keep exactly the base keys:

- ``class.<name>.<metric>`` for every request class (``Request.cls``): counts
  by final state, ``output_tokens``, ``throughput_tok_s`` (the class's output
  tokens per second of the run's makespan), and ``_mean``/``_p50``/``_p90``/
  ``_p99`` of queue delay, TTFT, TPOT and E2E over the class's finished
  requests (and ``slo_attainment`` with an SLO);
- ``rejected_<reason>`` and ``aborted_<reason>``: requests by final reason;
- ``truncated_<reason>``: finished requests that stopped short of their
  output length (``max_model_len``: the context was full);
- ``tenant.<name>.<metric>`` for every tenant: counts, ``output_tokens``,
  ``service_tokens`` (prompt tokens of requests that reached their first
  token, plus output tokens) and ``ttft_p99``; and ``jain_index``, Jain's
  fairness index ``(sum x)^2 / (n sum x^2)`` over the tenants' service
  tokens: 1 when every tenant received the same service, 1/n when one
  received all of it. It measures fairness when every tenant wants at least
  its share (all backlogged); a tenant that asks for less receives less
  without unfairness.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from orcasim.metrics.stats import percentiles
from orcasim.request import RequestState

QUANTILES = (50, 90, 99)
_FIN, _REJ, _ABT = int(RequestState.FINISHED), int(RequestState.REJECTED), int(RequestState.ABORTED)


def _describe(prefix: str, x: np.ndarray, out: dict[str, float]) -> None:
    x = x[np.isfinite(x)]
    out[f"{prefix}_mean"] = float(x.mean()) if x.size else float("nan")
    for q, v in zip(QUANTILES, percentiles(x, QUANTILES), strict=True):
        out[f"{prefix}_p{q}"] = v


def _labels(col: list[Any]) -> tuple[list[str], np.ndarray]:
    """Distinct non-None labels (in order of first appearance) and each row's index (-1: none)."""
    index: dict[Any, int] = {}
    codes = np.full(len(col), -1, dtype=np.int64)
    for i, v in enumerate(col):
        if v is not None:
            codes[i] = index.setdefault(v, len(index))
    return [str(k) for k in index], codes


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index of the allocations ``x`` (NaN for an empty or all-zero ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    s2 = float((x * x).sum())
    return float(x.sum()) ** 2 / (x.size * s2) if x.size and s2 > 0 else float("nan")


def group_summary(
    cols: dict[str, Any],
    lat: dict[str, np.ndarray],
    makespan: float,
    slo_ok: np.ndarray | None = None,
    inside: np.ndarray | None = None,
) -> dict[str, float]:
    """The per-class, per-tenant and per-reason keys for a run's summary.

    ``inside`` (the warm-up/cool-down window's requests) restricts the
    latency metrics, as for the run-wide ones; counts and tokens stay whole-run.
    """
    out: dict[str, float] = {}
    state = cols["state"]
    finished = state == _FIN
    timed = finished if inside is None else finished & inside
    n_out = cols["num_output_tokens"]
    for st, prefix in ((_REJ, "rejected"), (_ABT, "aborted")):
        idx = np.flatnonzero(state == st)
        if idx.size:
            reasons = Counter(cols["reason"][i] or "unknown" for i in idx.tolist())
            for reason, n in sorted(reasons.items()):
                out[f"{prefix}_{reason}"] = n
    why = cols["reason"]
    has = np.fromiter((bool(r) for r in why), dtype=bool, count=len(why))
    cut = [why[i] for i in np.flatnonzero(has & finished).tolist()]
    del has
    for reason, n in sorted(Counter(cut).items()):  # finished short of output_len
        out[f"truncated_{reason}"] = n
    names, codes = _labels(cols["cls"])
    for k, name in enumerate(names):
        m = codes == k
        p = f"class.{name}."
        out[p + "num_requests"] = int(m.sum())
        out[p + "num_finished"] = int((m & finished).sum())
        out[p + "num_rejected"] = int((m & (state == _REJ)).sum())
        out[p + "num_aborted"] = int((m & (state == _ABT)).sum())
        tokens = int(n_out[m].sum())
        out[p + "output_tokens"] = tokens
        out[p + "throughput_tok_s"] = tokens / makespan if makespan > 0 else float("nan")
        fm = m & timed
        for metric in ("queue_delay", "ttft", "tpot", "e2e"):
            _describe(p + metric, lat[metric][fm], out)
        if slo_ok is not None:
            nf = int(fm.sum())
            out[p + "slo_attainment"] = float(slo_ok[fm].sum() / nf) if nf else float("nan")
    names, codes = _labels(cols["tenant"])
    if names:
        prompt_done = np.where(np.isfinite(cols["first_token"]), cols["prompt_len"], 0)
        service = prompt_done + n_out
        per_tenant = []
        for k, name in enumerate(names):
            m = codes == k
            p = f"tenant.{name}."
            out[p + "num_requests"] = int(m.sum())
            out[p + "num_finished"] = int((m & finished).sum())
            out[p + "output_tokens"] = int(n_out[m].sum())
            out[p + "service_tokens"] = s = int(service[m].sum())
            out[p + "ttft_p99"] = percentiles(lat["ttft"][m & timed], (99,))[0]
            per_tenant.append(s)
        out["jain_index"] = jain_index(np.array(per_tenant))
    return out


def split_groups(summary: dict[str, float], kind: str = "class") -> dict[str, dict[str, float]]:
    """``{"class.a.ttft_p99": v}`` -> ``{"a": {"ttft_p99": v}}`` (``kind``: class or tenant)."""
    out: dict[str, dict[str, float]] = {}
    prefix = kind + "."
    for key, value in summary.items():
        if key.startswith(prefix):
            name, _, metric = key[len(prefix):].rpartition(".")
            out.setdefault(name, {})[metric] = value
    return out
