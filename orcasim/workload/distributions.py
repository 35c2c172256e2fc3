"""Arrival processes and length distributions for synthetic workloads.

Each draws a whole column at once from the run's generator, so the order in
which a workload calls them fixes the random stream (the seed notebook draws
inter-arrival gaps, then output lengths, then prompt lengths).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field, model_validator

from orcasim.params import ComponentParams
from orcasim.registry import arrivals, lengths


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
        rate: float = Field(gt=0, description="requests per second")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.params.rate, size=n))


@arrivals.register("at_once")
class AtOnce(ArrivalProcess):
    """Every request arrives at ``time`` (a queue that is full from the start)."""

    class Params(ComponentParams):
        time: float = Field(0.0, ge=0, description="arrival time of every request, s")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.params.time))


class _Clipped(ComponentParams):
    min: int | None = Field(None, ge=0, description="clip draws below this")
    max: int | None = Field(None, ge=0, description="clip draws above this")

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
        value: int = Field(ge=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.params.value, dtype=np.int64)


@lengths.register("uniform")
class Uniform(LengthDist):
    """Integers uniform on ``[low, high]``, both included."""

    class Params(ComponentParams):
        low: int = Field(ge=0)
        high: int = Field(ge=0)

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
        mu: float = Field(description="mean of the underlying normal (median = exp(mu))")
        sigma: float = Field(gt=0, description="standard deviation of the underlying normal")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        return _clip(rng.lognormal(mean=p.mu, sigma=p.sigma, size=n).astype(np.int64), p)
