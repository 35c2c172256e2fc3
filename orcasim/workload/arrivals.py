"""Arrival processes beyond Poisson: bursty gaps, on/off bursts, a daily rate curve, trace replay.

All draw whole columns from the run's generator and return ``n`` sorted
absolute times (seconds from the start of the run):

- ``gamma``: renewal process with Gamma gaps of mean ``1/rate`` and a chosen
  coefficient of variation (``cv`` 1 is Poisson; larger is burstier);
- ``mmpp``: a Markov-modulated Poisson process cycling through states, each
  with its own rate and an exponential (or fixed) holding time;
  ``onoff`` is the two-state case with a burst rate and a quiet rate;
- ``diurnal``: a non-homogeneous Poisson process whose rate follows a daily
  curve (a cosine or hourly points), drawn exactly by inverting the
  cumulative rate;
- ``trace``: the arrival times of a trace file, with a time window and
  a speed-up (replay at k times the trace's rate).
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import arrivals
from orcasim.workload.base import (
    MAX_RATE,
    MAX_REQUESTS_PER_RUN,
    MAX_SECONDS,
    FiniteFloat,
    PositiveSeconds,
    Rate,
    Seconds,
    check_items,
)
from orcasim.workload.distributions import ArrivalProcess

#: the most state changes an ``mmpp`` or ``onoff`` process may make to draw its arrivals
MAX_STATE_CHANGES = 10_000_000
#: a state with more arrivals than this (and than needed) draws only the ones it keeps
_BIG_DRAW = 10_000_000


@arrivals.register("gamma")
class GammaArrivals(ArrivalProcess):
    """Gamma-distributed gaps: mean ``1/rate``, coefficient of variation ``cv``.

    Shape ``1/cv^2`` and scale ``cv^2/rate``; ``cv`` 1 gives exponential gaps
    (Poisson), ``cv`` > 1 clusters arrivals into bursts separated by long
    gaps. The first request arrives one gap after t = 0.
    """

    class Params(ComponentParams):
        rate: Rate = Field(description="requests per second (mean)")
        cv: FiniteFloat = Field(1.0, ge=0.001, le=100, description="coefficient of variation "
                                "of the gaps, 0.001 to 100")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        k = 1.0 / (p.cv * p.cv)
        scale = 1.0 / (k * p.rate) if k * p.rate > 0 else math.inf  # a rate that underflows
        return np.cumsum(rng.gamma(k, scale, size=n))


def _modulated(rng: np.random.Generator, n: int, rates: list[float], means: list[float],
               fixed: bool, start_state: int) -> np.ndarray:
    """``n`` arrivals of a Poisson process whose rate cycles through ``rates``.

    State ``i`` lasts an exponential time of mean ``means[i]`` (exactly
    ``means[i]`` when ``fixed``). Within a state the arrivals are Poisson:
    a Poisson count for the state's duration, placed uniformly.
    """
    per_cycle = sum(r * d for r, d in zip(rates, means, strict=True))
    changes = len(rates) * n / per_cycle if per_cycle > 0 else math.inf
    if changes > MAX_STATE_CHANGES:
        raise ScenarioError("workload.arrival", f"{n} arrivals at {per_cycle:.3g} per cycle of "
                            f"states need about {changes:.3g} state changes, more than "
                            f"{MAX_STATE_CHANGES:,}: raise the rates or lengthen the durations")
    out: list[np.ndarray] = []
    got = 0
    t = 0.0
    state = start_state
    while got < n:
        d = means[state] if fixed else float(rng.exponential(means[state]))
        r = rates[state]
        if r > 0:
            k = int(rng.poisson(r * d))
            if k > _BIG_DRAW and k > n - got:
                out.append(t + d * _first_uniforms(rng, n - got, k))
                got = n
            elif k:
                out.append(np.sort(t + d * rng.random(k)))
                got += k
        t += d
        state = (state + 1) % len(rates)
    return np.concatenate(out)[:n]


def _first_uniforms(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """The ``m`` smallest of ``k`` sorted uniform draws on [0, 1), without drawing all ``k``.

    Sorted uniforms are the partial sums of ``k + 1`` unit exponentials over
    their total; the first ``m`` sums are drawn, the rest of the total is one
    Gamma(``k + 1 - m``) draw.
    """
    s = np.cumsum(rng.exponential(1.0, size=m))
    return s / (s[-1] + rng.gamma(k + 1 - m))


@arrivals.register("mmpp")
class MMPP(ArrivalProcess):
    """A Markov-modulated Poisson process: states visited in turn, each with a rate.

    State ``i`` has rate ``rates[i]`` (req/s, may be 0) and lasts an
    exponential time of mean ``mean_durations[i]`` seconds (or exactly that
    long with ``holding: fixed``); then the next state follows, cyclically.
    Two states give the classic on/off burst model (see ``onoff``).
    """

    class Params(ComponentParams):
        rates: list[float] = Field(min_length=1, description="rate of each state, req/s "
                                   "(finite, at most 1e6: MAX_RATE)")
        mean_durations: list[float] = Field(min_length=1, description="mean time in each "
                                            "state, s (finite, at most 1e9: MAX_SECONDS)")
        holding: Literal["exponential", "fixed"] = "exponential"
        start_state: int = Field(0, ge=0, description="state at t = 0")

        @model_validator(mode="after")
        def _check(self) -> MMPP.Params:
            if len(self.rates) != len(self.mean_durations):
                raise ValueError(f"rates has {len(self.rates)} states, mean_durations has "
                                 f"{len(self.mean_durations)}")
            check_items(self.rates, "rates", 0, MAX_RATE)
            check_items(self.mean_durations, "mean_durations", 0, MAX_SECONDS, above_lo=True)
            if any(r < 0 for r in self.rates) or not any(r > 0 for r in self.rates):
                raise ValueError("rates must be >= 0 and at least one must be > 0")
            if self.start_state >= len(self.rates):
                raise ValueError(f"start_state must be < {len(self.rates)}")
            return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        return _modulated(rng, n, p.rates, p.mean_durations, p.holding == "fixed", p.start_state)


@arrivals.register("onoff")
class OnOff(ArrivalProcess):
    """Bursts: ``rate_on`` for on-periods of mean ``mean_on`` s, ``rate_off`` between them.

    A two-state MMPP starting in the on state. The long-run rate is
    ``(rate_on*mean_on + rate_off*mean_off) / (mean_on + mean_off)``.
    """

    class Params(ComponentParams):
        rate_on: Rate = Field(le=MAX_RATE, description="requests per second during a burst "
                              "(at most 1e6)")
        rate_off: float = Field(0.0, ge=0, le=MAX_RATE, description="requests per second "
                                "between bursts")
        mean_on: PositiveSeconds = Field(description="mean burst length, s (at most 1e9)")
        mean_off: PositiveSeconds = Field(description="mean quiet time between bursts, s")
        holding: Literal["exponential", "fixed"] = "exponential"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        return _modulated(rng, n, [p.rate_on, p.rate_off], [p.mean_on, p.mean_off],
                          p.holding == "fixed", 0)


@arrivals.register("diurnal")
class Diurnal(ArrivalProcess):
    """Poisson arrivals whose rate follows a daily (periodic) curve.

    The rate is either a cosine, ``mean_rate * (1 + amplitude * cos(2 pi (t -
    peak_at) / period))``, or the piecewise-linear curve through ``curve``
    points ``[time, rate]`` (times within one period, repeated every period).
    The run starts at ``start`` seconds into the period. Arrival times are
    exact: unit-rate exponential sums mapped through the inverse of the
    cumulative rate (the cosine is evaluated as 1,440 linear pieces per
    period, one per minute of a day).
    """

    class Params(ComponentParams):
        period: PositiveSeconds = Field(86400.0, ge=1e-3, description="length of one cycle, "
                                        "s (1 ms to 1e9 s)")
        mean_rate: float | None = Field(None, gt=0, le=MAX_RATE, description="average rate, "
                                        "req/s (cosine; at most 1e6)")
        amplitude: FiniteFloat = Field(0.5, ge=0, le=1, description="peak = mean x (1 + "
                                       "amplitude)")
        peak_at: Seconds = Field(50400.0, description="time of the peak in the period, s")
        curve: list[tuple[float, float]] | None = Field(
            None, description="[time s, rate req/s] points instead of the cosine (rates at "
            "most 1e6)")
        start: Seconds = Field(0.0, description="time in the period at which the run starts")

        @model_validator(mode="after")
        def _check(self) -> Diurnal.Params:
            if (self.mean_rate is None) == (self.curve is None):
                raise ValueError("give either mean_rate (a cosine) or curve (points), not both")
            if self.curve is not None:
                check_items([t for t, _ in self.curve], "curve", 0, MAX_SECONDS)
                check_items([r for _, r in self.curve], "curve", 0, MAX_RATE)
                ts = [t for t, _ in self.curve]
                if not ts or any(b <= a for a, b in pairwise(ts)):
                    raise ValueError("curve times must be increasing")
                if ts[0] < 0 or ts[-1] >= self.period:
                    raise ValueError("curve times must lie in [0, period)")
                if any(r < 0 for _, r in self.curve) or not any(r > 0 for _, r in self.curve):
                    raise ValueError("curve rates must be >= 0 and not all 0")
            return self

    def knots(self) -> tuple[np.ndarray, np.ndarray]:
        """Times ``[0, ..., period]`` and the rate at each: the curve over one period."""
        p = self.params
        if p.curve is None:
            t = np.linspace(0.0, p.period, 1441)
            r = p.mean_rate * (1.0 + p.amplitude * np.cos(2 * np.pi * (t - p.peak_at) / p.period))
            return t, np.maximum(r, 0.0)
        t = np.array([c[0] for c in p.curve], dtype=np.float64)
        r = np.array([c[1] for c in p.curve], dtype=np.float64)
        # wrap around: the curve runs from the last point back to the first one a period later
        h = p.period - t[-1] + t[0]
        r_wrap = r[-1] + (r[0] - r[-1]) * (p.period - t[-1]) / h  # the rate at 0 and at period
        if t[0] > 0:
            t, r = np.r_[0.0, t], np.r_[r_wrap, r]
        return np.r_[t, p.period], np.r_[r, r_wrap]

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        """The arrival rate at run times ``t`` (req/s)."""
        kt, kr = self.knots()
        return np.interp((np.asarray(t) + self.params.start) % self.params.period, kt, kr)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        kt, kr = self.knots()
        h = np.diff(kt)
        slopes = np.diff(kr) / h
        cum = np.concatenate([[0.0], np.cumsum(h * (kr[:-1] + kr[1:]) / 2)])  # exact integral
        phase = p.start % p.period
        j0 = min(int(np.searchsorted(kt, phase, side="right")) - 1, len(h) - 1)
        x0 = phase - kt[j0]
        offset = cum[j0] + kr[j0] * x0 + slopes[j0] * x0 * x0 / 2  # cumulative rate at `start`
        u = np.cumsum(rng.exponential(1.0, size=n)) + offset
        m = np.floor(u / cum[-1])
        res = u - m * cum[-1]
        j = np.clip(np.searchsorted(cum, res, side="left") - 1, 0, len(h) - 1)
        r0 = kr[j]
        a = res - cum[j]
        # solve r0*x + slope*x^2/2 = a for x in the segment (stable for any slope sign)
        den = r0 + np.sqrt(np.maximum(r0 * r0 + 2 * slopes[j] * a, 0.0))
        x = np.divide(2 * a, den, out=np.zeros_like(a), where=den > 0)
        t = m * p.period + kt[j] + np.minimum(x, h[j]) - phase
        return np.maximum.accumulate(np.maximum(t, 0.0))


class TraceWindow(ComponentParams):
    """Which part of a trace to replay, and how fast."""

    file: str = Field(description="trace file path, or a shipped slice (e.g. azure_conv)")
    format: Literal["auto", "azure", "mooncake", "lengths", "sharegpt", "tokens"] = "auto"
    start: FiniteFloat = Field(0.0, ge=0, description="replay from this trace time, s")
    end: float | None = Field(None, gt=0, allow_inf_nan=False, description="replay up to (not "
                              "including) this time, s")
    speedup: FiniteFloat = Field(1.0, gt=0, le=1e9, description="replay at this many times "
                                 "the trace's rate (at most 1e9)")
    rate: float | None = Field(None, gt=0, allow_inf_nan=False, description="replay at this "
                               "mean rate instead, req/s")

    @model_validator(mode="after")
    def _check(self) -> TraceWindow:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be > start ({self.start})")
        if self.rate is not None and self.speedup != 1.0:
            raise ValueError("give either speedup or rate, not both")
        return self


def replay_times(times: np.ndarray, w: TraceWindow, source: str, where: str = "workload"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(row indices, run times)`` of the trace rows inside the window, rescaled.

    Run time = (trace time - ``start``) / speed-up, so the window's start is
    the run's t = 0. With ``rate``, the speed-up is ``rate`` divided by the
    window's own rate, (rows - 1) / (last time - first time). An empty
    window, or one of more than :data:`MAX_REQUESTS_PER_RUN` rows, is a
    :class:`ScenarioError` naming the window fields under ``where``.
    """
    lo = int(np.searchsorted(times, w.start, side="left"))
    hi = len(times) if w.end is None else int(np.searchsorted(times, w.end, side="left"))
    fields = f"{where}.start" + ("" if w.end is None else f", {where}.end")
    if hi <= lo:
        upto = "the end" if w.end is None else f"{w.end:g} s"
        raise ScenarioError(fields, f"no trace rows between {w.start:g} s and {upto} (the "
                            f"trace's times run from {times[0]:g} s to {times[-1]:g} s)",
                            source)
    if hi - lo > MAX_REQUESTS_PER_RUN:
        raise ScenarioError(fields, f"the window holds {hi - lo:,} rows, more than the limit "
                            f"of {MAX_REQUESTS_PER_RUN:,} requests per run", source)
    idx = np.arange(lo, hi)
    speedup = w.speedup
    if w.rate is not None:
        span = times[hi - 1] - times[lo]
        if hi - lo < 2 or span <= 0:
            raise OrcasimError(f"{source}: the window has no measurable rate to rescale "
                               "(fewer than two distinct arrival times)")
        speedup = w.rate / ((hi - lo - 1) / span)
    return idx, (times[lo:hi] - w.start) / speedup


@arrivals.register("trace")
class TraceArrivals(ArrivalProcess):
    """The arrival times of a trace file, windowed and sped up (lengths come from elsewhere).

    Takes the first ``n`` arrivals of the window; a window with fewer is an error.
    """

    class Params(TraceWindow):
        pass

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        from orcasim.workload.traces import load_trace

        p = self.params
        trace = load_trace(p.file, p.format)
        if trace.arrival is None:
            raise OrcasimError(f"{trace.source}: this trace has no arrival times")
        _, t = replay_times(trace.arrival, p, trace.source, "workload.arrival")
        if len(t) < n:
            raise OrcasimError(f"{trace.source}: the window holds {len(t)} arrivals, fewer than "
                               f"the {n} requests asked for")
        return np.array(t[:n], dtype=np.float64)
