"""Per-request keys of the ordered token policies: class levels, predicted lengths, a cache.

- :class:`ClassLevels`: a request's priority level from its class (or its own ``priority``).
- :class:`LengthPredictor`: true or noisy output lengths (``sjf``, ``srpt``).
- :class:`KeyCache`: keys by request, each computed once (running requests ranked every step).

Pure data structures: no SimPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orcasim.errors import SimulationError
from orcasim.request import Request

if TYPE_CHECKING:
    from orcasim.context import SchedulerContext


class KeyCache(dict):  # type: ignore[type-arg]
    """Keys of requests by request, each computed by ``key`` when first asked for."""

    __slots__ = ("_key",)

    def __init__(self, key: Callable[[Request], Any]) -> None:
        super().__init__()
        self._key = key

    def __missing__(self, req: Request) -> Any:
        k = self[req] = self._key(req)
        return k


class ClassLevels:
    """A request's priority level (smaller is more important).

    With a ``classes`` mapping (class name -> level) the level comes from the
    request's class, and a request whose class is not listed is an error;
    without one it is the request's own ``priority``.
    """

    def __init__(self, classes: dict[str, int] | None) -> None:
        self.classes = classes

    def __call__(self, req: Request) -> int:
        classes = self.classes
        if classes is None:
            return req.priority
        level = classes.get(req.cls)  # type: ignore[arg-type]
        if level is None:
            raise SimulationError(
                f"request {req.label} has class {req.cls!r}, which policy.classes does not list "
                f"({', '.join(map(str, classes))})"
            )
        return level


class LengthPredictor:
    """Predicted output lengths: the true one, or the true one times ``exp(N(0, sigma))``.

    ``sigma = 0`` is the oracle. The noise is drawn once per request, when
    the policy first asks, from the run's policy generator (``ctx.rng``), so a
    run stays reproducible and the workload's draws are untouched. The
    median prediction is the true length; ``sigma = 0.5`` puts two thirds of
    the predictions within a factor 1.65 of it.
    """

    def __init__(self, sigma: float, ctx: SchedulerContext) -> None:
        self.sigma = sigma
        self.ctx = ctx
        self._pred: dict[int, float] = {}

    def __call__(self, req: Request) -> float:
        return self.of_row(req.id, req.output_len)

    def of_row(self, rid: int, output_len: int) -> float:
        """The prediction for request ``rid`` of true length ``output_len`` (as a call with
        the request)."""
        if self.sigma == 0.0:
            return float(output_len)
        pred = self._pred.get(rid)
        if pred is None:
            pred = self._pred[rid] = output_len * math.exp(
                self.sigma * float(self.ctx.rng.standard_normal()))
        return pred

    def forget(self, req: Request) -> None:
        """Drop ``req``'s prediction (it left the system)."""
        self._pred.pop(req.id, None)


def row_columns(source: Any) -> dict[str, Any]:
    """A lazy open-loop source's per-request workload columns by attribute (an attribute
    without one keeps the :class:`~orcasim.request.Request` default)."""
    return dict(source._attrs)
