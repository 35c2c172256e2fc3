"""Arrival processes and length distributions for synthetic workloads.

Each draws a whole column at once from the run's generator, so the order in
which a workload calls them fixes the random stream (the seed notebook draws
inter-arrival gaps, then output lengths, then prompt lengths).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import Field, model_validator

from orcasim.errors import ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import arrivals, lengths
from orcasim.spec import Spec
from orcasim.workload.base import (
    LIMITS_NOTE,
    MAX_REQUESTS_PER_RUN,
    MAX_SECONDS,
    MAX_TOKENS_PER_REQUEST,
    TOKEN_LIMIT,
    FiniteFloat,
    Seconds,
    TokenCount,
    field_error,
)

#: the largest |mu| of a lognormal: exp(50) is already about 5e21 tokens
MAX_LOG_MU = 50.0
#: the largest sigma of a lognormal: a spread of exp(10) (22,000x) per standard deviation
MAX_LOG_SIGMA = 10.0


class Sampler:
    """A registered component that draws a whole column of ``n`` values from the run's generator."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError


class ArrivalProcess(Sampler):
    """Draws ``n`` absolute arrival times, sorted, starting from time 0."""


class LengthDist(Sampler):
    """Draws ``n`` token counts as an int64 array."""


@arrivals.register("poisson")
class Poisson(ArrivalProcess):
    """Poisson arrivals: exponential gaps with mean ``1/rate``; the first arrival is one gap in."""

    class Params(ComponentParams):
        rate: float = Field(gt=0, allow_inf_nan=False, description="requests per second")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.params.rate, size=n))


@arrivals.register("at_once")
class AtOnce(ArrivalProcess):
    """Every request arrives at ``time`` (a queue that is full from the start)."""

    class Params(ComponentParams):
        time: Seconds = Field(0.0, description="arrival time of every request, s (at most 1e9)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.params.time))


class _Clipped(ComponentParams):
    min: int | None = Field(None, ge=0, le=MAX_TOKENS_PER_REQUEST,
                            description=f"clip draws below this ({LIMITS_NOTE})")
    max: int | None = Field(None, ge=0, le=MAX_TOKENS_PER_REQUEST,
                            description=f"clip draws above this ({LIMITS_NOTE})")

    @model_validator(mode="after")
    def _order(self) -> _Clipped:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


def _clip(x: np.ndarray, p: _Clipped) -> np.ndarray:
    if p.min is not None or p.max is not None:
        x = np.clip(x, p.min, p.max)
    return x


@lengths.register("fixed")
class Fixed(LengthDist):
    """Every request has ``value`` tokens (draws nothing from the generator)."""

    class Params(ComponentParams):
        value: TokenCount = Field(description=f"tokens of every request ({LIMITS_NOTE}; "
                                  "an output needs at least 1)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.params.value, dtype=np.int64)


@lengths.register("uniform")
class Uniform(LengthDist):
    """Integers uniform on ``[low, high]``, both included."""

    class Params(ComponentParams):
        low: TokenCount = Field(description=f"smallest count ({LIMITS_NOTE})")
        high: TokenCount = Field(description=f"largest count ({LIMITS_NOTE})")

        @model_validator(mode="after")
        def _order(self) -> Uniform.Params:
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
            return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.params.low, self.params.high + 1, size=n, dtype=np.int64)


@lengths.register("lognormal")
class LogNormal(LengthDist):
    """``exp(N(mu, sigma))`` truncated to an integer, then clipped to ``[min, max]``.

    ``mu`` and ``sigma`` are numpy's ``mean`` and ``sigma``: the parameters of
    the underlying normal, so the median is ``exp(mu)``.
    """

    class Params(_Clipped):
        mu: FiniteFloat = Field(ge=-MAX_LOG_MU, le=MAX_LOG_MU, description="mean of the "
                                "underlying normal (median = exp(mu)); |mu| at most 50")
        sigma: FiniteFloat = Field(gt=0, le=MAX_LOG_SIGMA, description="standard deviation of "
                                   "the underlying normal; at most 10")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        return _clip(to_counts(rng.lognormal(mean=p.mu, sigma=p.sigma, size=n)), p)


#: float draws are capped here before truncation, so they stay int64 (and exceed the limit)
_COUNT_CAP = float(2**62)


def to_counts(x: np.ndarray) -> np.ndarray:
    """Float draws truncated to int64 token counts; draws beyond int64 become ``2**62``.

    A cap rather than numpy's undefined conversion keeps a huge draw huge, so
    it is clipped by ``max`` or reported as beyond the limit, never wrapped
    into a negative count.
    """
    return np.minimum(x, _COUNT_CAP).astype(np.int64)


def draw_lengths(spec: Spec, rng: np.random.Generator, n: int, field: str) -> np.ndarray:
    """``n`` token counts from the length distribution ``spec``, checked against the limits.

    A draw beyond :data:`MAX_TOKENS_PER_REQUEST` (a lognormal's tail without
    ``max``) is a :class:`ScenarioError` naming ``field``.
    """
    x = np.asarray(spec.create().sample(rng, n), dtype=np.int64)
    bad = np.flatnonzero(x > MAX_TOKENS_PER_REQUEST)
    if bad.size:
        raise ScenarioError(field, f"drew {int(x[bad[0]]):,} tokens, more than {TOKEN_LIMIT}: "
                            "set max on the distribution or lower it")
    return x


def draw_arrivals(spec: Spec, rng: np.random.Generator, n: int, field: str) -> np.ndarray:
    """``n`` arrival times from the process ``spec``, each finite and at most :data:`MAX_SECONDS`.

    A process slow enough to push arrivals past the limit (a tiny rate, a
    long quiet state) is a :class:`ScenarioError` naming ``field``.
    """
    t = np.asarray(spec.create().sample(rng, n), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(t) | (t > MAX_SECONDS))
    if bad.size:
        k = int(bad[0])
        raise ScenarioError(field, f"arrival {k + 1} of {n} falls at {float(t[k]):.6g} s, "
                            f"past the limit of {MAX_SECONDS:g} s (MAX_SECONDS): raise the rate")
    return t


def check_request_count(n: int, field: str) -> None:
    """Refuse a run of more than :data:`MAX_REQUESTS_PER_RUN` requests, naming ``field``."""
    if n > MAX_REQUESTS_PER_RUN:
        raise ScenarioError(field, f"{n:,} requests, more than the limit of "
                            f"{MAX_REQUESTS_PER_RUN:,} per run (MAX_REQUESTS_PER_RUN)")


def refuse_empty_outputs(spec: Any) -> Any:
    """Validator of an ``output_len`` field: refuse a distribution that can only draw 0.

    Sees the raw section (a mapping), before it is built into a spec, so the
    error names the exact parameter: ``fixed`` ``value``, ``uniform``
    ``high``, or a clip ``max`` of 0.
    """
    if not isinstance(spec, dict):
        return spec
    kind = spec.get("type")
    key = {"fixed": "value", "uniform": "high"}.get(kind, "max") if isinstance(kind, str) \
        else "max"
    value = spec.get(key)
    if type(value) in (int, float) and value == 0:
        raise field_error((key,), "must be >= 1: every request generates at least one "
                          "output token", value)
    return spec
