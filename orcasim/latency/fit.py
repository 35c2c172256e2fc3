"""Fitting latency-model coefficients to measured step times (``orcasim calibrate``).

Both fits are least squares (``scipy.optimize.least_squares``) on
*relative* errors, ``(predicted - measured) / measured``, since the noise
of a measured step time grows with the step (a 300 ms prefill varies by
milliseconds, a 7 ms decode step by tens of microseconds); the coefficients
are bounded to their valid ranges. Confidence intervals come from the
Jacobian of the relative residuals at the optimum: ``cov = s^2 (J^T J)^-1``
with ``s^2`` their variance (``SSR / (m - p)``), and Student's t quantile
with ``m - p`` degrees of freedom. A
coefficient the data cannot determine (no prefill rows for
``per_prefill_token``, no compute-bound step for ``compute_efficiency``) is
not fitted: it keeps its default and is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from orcasim.errors import OrcasimError
from orcasim.latency.linear import LinearLatency
from orcasim.latency.measurements import Measurements
from orcasim.latency.roofline import RooflineCost, RooflineParams
from orcasim.model_specs import resolve_gpu, resolve_model


@dataclass
class Fit:
    """Fitted coefficients, their confidence intervals and the fit error."""

    model: str
    values: dict[str, float]  # every parameter of the latency model's scenario section
    intervals: dict[str, tuple[float, float]]  # fitted coefficients only
    not_fitted: dict[str, str] = field(default_factory=dict)  # name -> why
    predicted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    measured: np.ndarray = field(default_factory=lambda: np.zeros(0))
    confidence: float = 0.95

    @property
    def errors(self) -> dict[str, float]:
        """RMSE (s), mean and max absolute relative error, R^2."""
        r = self.predicted - self.measured
        rel = np.abs(r) / self.measured
        ss_tot = float(((self.measured - self.measured.mean()) ** 2).sum())
        return {
            "rmse": float(np.sqrt((r**2).mean())),
            "mape": float(rel.mean()),
            "max_rel": float(rel.max()),
            "r2": 1.0 - float((r**2).sum()) / ss_tot if ss_tot > 0 else float("nan"),
        }


def _intervals(res: optimize.OptimizeResult, m: int, confidence: float,
               free: list[int]) -> list[tuple[float, float]]:
    """Confidence intervals of ``res.x[free]`` from the Jacobian at the optimum."""
    p = len(free)
    dof = m - p
    if dof <= 0:
        raise OrcasimError(f"{m} measurements cannot determine {p} coefficients with an error "
                           "estimate: add rows")
    jac = res.jac[:, free]
    s2 = float((res.fun**2).sum()) / dof
    cov = s2 * np.linalg.pinv(jac.T @ jac)
    half = stats.t.ppf(0.5 + confidence / 2, dof) * np.sqrt(np.maximum(np.diag(cov), 0.0))
    x = res.x[free]
    return list(zip((x - half).tolist(), (x + half).tolist(), strict=True))


def fit_linear(meas: Measurements, confidence: float = 0.95) -> Fit:
    """Fit ``base + per_seq*B + per_token*KV + per_prefill_token*prefill`` (all >= 0)."""
    b, prefill, _, kv = meas.x.T
    y = meas.seconds
    cols = {"base": np.ones_like(y), "per_seq": b, "per_token": kv,
            "per_prefill_token": prefill}
    names = list(cols)
    a_full = np.column_stack([cols[n] for n in names])
    not_fitted: dict[str, str] = {}
    if not prefill.any():
        not_fitted["per_prefill_token"] = "no measured step computes prefill tokens"
    if not kv.any():
        not_fitted["per_token"] = "no measured step reads KV tokens"
    free = [i for i, n in enumerate(names) if n not in not_fitted]
    w = (1.0 / y)[:, None]
    a = a_full[:, free] * w  # relative residuals: (A x - y) / y
    x0 = np.maximum(np.linalg.lstsq(a, np.ones_like(y), rcond=None)[0], 0.0)
    res = optimize.least_squares(lambda x: a @ x - 1.0, x0, jac=lambda x: a,
                                 bounds=(0.0, np.inf), method="trf", x_scale="jac")
    defaults = LinearLatency.Params()
    x = np.array([getattr(defaults, n) for n in names], dtype=np.float64)
    x[free] = res.x
    full = optimize.OptimizeResult(x=x, jac=a_full * w, fun=res.fun)
    ci = _intervals(full, len(y), confidence, free)
    return Fit(
        model="linear",
        values={n: float(v) for n, v in zip(names, x, strict=True)},
        intervals={names[i]: c for i, c in zip(free, ci, strict=True)},
        not_fitted=not_fitted,
        predicted=a_full @ x,
        measured=y,
        confidence=confidence,
    )


def fit_roofline(meas: Measurements, model: str, gpu: str, tp: int = 1,
                 confidence: float = 0.95) -> Fit:
    """Fit ``compute_efficiency``, ``bandwidth_efficiency`` and ``overhead`` of a roofline.

    The model, GPU and parallelism are fixed; the fit is on ``1/efficiency``
    (the roofline is linear in it on each side of the max), and the
    intervals are mapped back through ``1/x``.
    """
    defaults = RooflineParams(model=model, gpu=gpu, tp=tp)
    cost = RooflineCost(resolve_model(model), resolve_gpu(gpu), tp)
    g = cost.gpu
    terms = np.array([cost.terms(plan) for plan in meas.plans()])
    compute = terms[:, 0] / g.peak_flops  # seconds at 100 % efficiency
    memory = terms[:, 1] / g.hbm_bandwidth
    fixed = terms[:, 2] / defaults.allreduce_rate(g) + \
        cost.num_allreduces * defaults.allreduce_latency
    y = meas.seconds

    def predict(x: np.ndarray) -> np.ndarray:
        return np.maximum(compute * x[0], memory * x[1]) + x[2] + fixed

    def jac(x: np.ndarray) -> np.ndarray:
        c = compute * x[0] >= memory * x[1]
        return np.column_stack([np.where(c, compute, 0.0), np.where(c, 0.0, memory),
                                np.ones_like(y)])

    x0 = np.array([1 / defaults.compute_efficiency, 1 / defaults.bandwidth_efficiency,
                   defaults.overhead])
    res = optimize.least_squares(lambda x: predict(x) / y - 1.0, x0,
                                 jac=lambda x: jac(x) / y[:, None],
                                 bounds=([1.0, 1.0, 0.0], [np.inf, np.inf, np.inf]),
                                 method="trf", x_scale=[1.0, 1.0, 1e-3])
    bound = jac(res.x)
    names = ["compute_efficiency", "bandwidth_efficiency", "overhead"]
    not_fitted: dict[str, str] = {}
    if not bound[:, 0].any():
        not_fitted["compute_efficiency"] = "no measured step is compute-bound"
    if not bound[:, 1].any():
        not_fitted["bandwidth_efficiency"] = "no measured step is memory-bound"
    free = [i for i, n in enumerate(names) if n not in not_fitted]
    x = res.x.copy()
    for i, n in enumerate(names[:2]):
        if n in not_fitted:
            x[i] = x0[i]
    ci = _intervals(optimize.OptimizeResult(x=x, jac=bound / y[:, None], fun=res.fun), len(y),
                    confidence, free)
    intervals: dict[str, tuple[float, float]] = {}
    for i, (lo, hi) in zip(free, ci, strict=True):
        if i < 2:  # 1/efficiency -> efficiency
            intervals[names[i]] = (1.0 / hi if hi > 0 else float("inf"),
                                   1.0 / lo if lo > 0 else float("inf"))
        else:
            intervals[names[i]] = (lo, hi)
    values = defaults.model_dump()
    values.update(compute_efficiency=float(1 / x[0]), bandwidth_efficiency=float(1 / x[1]),
                  overhead=float(x[2]))
    if values.get("allreduce_bandwidth") is None:
        values.pop("allreduce_bandwidth", None)
    return Fit("roofline", values, intervals, not_fitted, predict(x), y, confidence)


def format_fit(fit: Fit, source: str) -> str:
    """The fit as YAML for a scenario's ``engine`` section, with the statistics as comments."""
    e = fit.errors
    pct = f"{fit.confidence * 100:g}"
    lines = [
        f"# {fit.model} latency model fitted to {len(fit.measured)} measured steps from {source}",
        f"# fit error: RMSE {e['rmse'] * 1e3:.4g} ms, mean |error| {e['mape'] * 100:.3g} %, "
        f"max |error| {e['max_rel'] * 100:.3g} %, R^2 {e['r2']:.5f}",
        f"# {pct}% confidence intervals:",
    ]
    for name, (lo, hi) in fit.intervals.items():
        lines.append(f"#   {name}: {lo:.6g} .. {hi:.6g}")
    for name, why in fit.not_fitted.items():
        lines.append(f"#   {name}: not fitted ({why}); default kept")
    lines += ["engine:", "  latency:", f"    type: {fit.model}"]
    for name, value in fit.values.items():
        lines.append(f"    {name}: {_yaml_value(value)}")
    return "\n".join(lines)


def _yaml_value(v: object) -> str:
    if isinstance(v, float):
        s = f"{v:.6g}"
        if "e" in s and "." not in s:  # YAML 1.1 reads 2e-05 as a string, 2.0e-05 as a number
            s = s.replace("e", ".0e")
        return s
    return str(v)
