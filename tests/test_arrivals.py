"""Arrival processes: gamma, MMPP / on-off, diurnal, trace replay."""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.registry import arrivals
from orcasim.spec import build_spec


def draw(spec: dict, n: int, seed: int = 0) -> np.ndarray:
    return build_spec(arrivals, spec, "arrival").create().sample(np.random.default_rng(seed), n)


def test_gamma_matches_rate_and_cv():
    t = draw({"type": "gamma", "rate": 4.0, "cv": 3.0}, 200_000)
    gaps = np.diff(np.r_[0.0, t])
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.03)


def test_gamma_is_the_exact_gamma_stream():
    rng = np.random.default_rng(7)
    expected = np.cumsum(rng.gamma(0.25, 1.0 / (0.25 * 2.0), size=5))
    assert draw({"type": "gamma", "rate": 2.0, "cv": 2.0}, 5, seed=7).tolist() == \
        expected.tolist()


def test_onoff_bursts_and_long_run_rate():
    spec = {"type": "onoff", "rate_on": 50.0, "rate_off": 0.0, "mean_on": 2.0, "mean_off": 8.0,
            "holding": "fixed"}
    t = draw(spec, 20_000)
    phase = t % 10.0
    assert np.all(phase < 2.0)  # nothing arrives while off
    assert len(t) / t[-1] == pytest.approx(50.0 * 2 / 10, rel=0.03)


def test_mmpp_exponential_holding_long_run_rate():
    spec = {"type": "mmpp", "rates": [20.0, 2.0, 0.0], "mean_durations": [1.0, 3.0, 1.0]}
    t = draw(spec, 100_000)
    assert np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx((20 * 1 + 2 * 3) / 5, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() > 1.5  # burstier than Poisson


@pytest.mark.parametrize("bad,msg", [
    ({"rates": [1.0], "mean_durations": [1.0, 2.0]}, "rates has 1 states"),
    ({"rates": [0.0, 0.0], "mean_durations": [1.0, 2.0]}, "at least one must be > 0"),
    ({"rates": [1.0], "mean_durations": [1.0], "start_state": 1}, "start_state must be < 1"),
])
def test_mmpp_rejects_bad_params(bad, msg):
    with pytest.raises(ScenarioError, match=msg):
        build_spec(arrivals, {"type": "mmpp", **bad}, "arrival")


def _cumulative_rate(proc, t: np.ndarray) -> np.ndarray:
    """Integral of the rate from the run's start, by fine trapezoids (independent check)."""
    grid = np.linspace(0.0, float(t.max()), 400_001)
    r = proc.rate(grid)
    cum = np.r_[0.0, np.cumsum(np.diff(grid) * (r[1:] + r[:-1]) / 2)]
    return np.interp(t, grid, cum)


def test_diurnal_inverts_the_cumulative_rate():
    spec = {"type": "diurnal", "period": 100.0, "mean_rate": 5.0, "amplitude": 0.8,
            "peak_at": 30.0, "start": 10.0}
    proc = build_spec(arrivals, spec, "arrival").create()
    t = proc.sample(np.random.default_rng(3), 50)
    e = np.cumsum(np.random.default_rng(3).exponential(1.0, size=50))
    # time-rescaling: the cumulative rate at each arrival is the unit-rate Poisson time
    assert _cumulative_rate(proc, t) == pytest.approx(e, abs=2e-4)


def test_diurnal_curve_points_and_busy_hours():
    spec = {"type": "diurnal", "period": 24.0, "curve": [[0, 1.0], [6, 0.0], [12, 10.0],
                                                          [18, 10.0]]}
    proc = build_spec(arrivals, spec, "arrival").create()
    assert proc.rate(np.array([0.0, 3.0, 6.0, 15.0, 21.0])).tolist() == \
        pytest.approx([1.0, 0.5, 0.0, 10.0, 5.5])
    t = proc.sample(np.random.default_rng(0), 200_000)
    hour = t % 24
    per_day = len(t) / (t[-1] / 24)
    assert per_day == pytest.approx(24 * np.mean(proc.rate(np.linspace(0, 24, 100_001))),
                                    rel=0.01)
    assert np.mean((hour >= 12) & (hour < 18)) == pytest.approx(60 / per_day, rel=0.03)


@pytest.mark.parametrize("bad,msg", [
    ({"mean_rate": 1.0, "curve": [[0, 1.0]]}, "either mean_rate"),
    ({"curve": [[0, 1.0], [0, 2.0]]}, "curve times must be increasing"),
    ({"curve": [[0, 1.0], [86400, 2.0]]}, r"curve times must lie in \[0, period\)"),
    ({"curve": [[0, 0.0]]}, "not all 0"),
    ({"mean_rate": 1.0, "amplitude": 1.5}, "less than or equal to 1"),
])
def test_diurnal_rejects_bad_params(bad, msg):
    with pytest.raises(ScenarioError, match=msg):
        build_spec(arrivals, {"type": "diurnal", **bad}, "arrival")


def test_trace_arrivals_window_and_speedup():
    # azure_conv's first rows: 18:15:46.6805900, 18:15:50.9951690, 18:15:51.2224670
    t = draw({"type": "trace", "file": "azure_conv"}, 3)
    assert t.tolist() == pytest.approx([0.0, 4.314579, 4.541877])
    t2 = draw({"type": "trace", "file": "azure_conv", "speedup": 2.0}, 3)
    assert t2.tolist() == pytest.approx((t / 2).tolist())
    w = draw({"type": "trace", "file": "azure_conv", "start": 100.0, "end": 200.0}, 5)
    assert 0 <= w[0] < 1.0 and np.all(np.diff(w) >= 0)
    with pytest.raises(OrcasimError, match="holds 2867 arrivals, fewer than the 3000"):
        draw({"type": "trace", "file": "azure_conv"}, 3000)


def test_trace_arrivals_at_a_target_rate():
    t = draw({"type": "trace", "file": "azure_conv", "end": 300.0, "rate": 10.0}, 1000)
    from orcasim.workload.traces import load_trace

    base = load_trace("azure_conv").arrival
    k = int(np.searchsorted(base, 300.0))
    window_rate = (k - 1) / base[k - 1]
    assert t[:5].tolist() == pytest.approx((base[:5] * window_rate / 10.0).tolist())
