"""``sjf``: shortest job first by predicted output length.

Waiting requests are admitted in order of their predicted output length: the
true one (``sigma: 0``, an oracle) or the true one times a lognormal error
``exp(N(0, sigma))`` drawn from the run's policy generator, so the value of a
length predictor can be studied by varying ``sigma``. Non-preemptive: a
running request keeps its place (see ``srpt`` for the preemptive variant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from orcasim.context import SchedulerContext
from orcasim.policies.common import TokenParams
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.keys import LengthPredictor
from orcasim.registry import policies
from orcasim.request import Request


class LengthParams(TokenParams):
    sigma: float = Field(0.0, ge=0, description="lognormal error of the predicted output length "
                         "(0: the true length)")


@policies.register("sjf")
class SJF(KeyedPolicy):
    """Shortest (predicted) output first; non-preemptive."""

    runs_unchanged = True  # srpt too: remaining lengths only shrink, so no new victim mid-run

    Params = LengthParams

    def __init__(self, params: LengthParams, ctx: SchedulerContext) -> None:
        self.predict = LengthPredictor(params.sigma, ctx)
        super().__init__(params, ctx)
        if params.sigma != 0.0:  # (the true lengths keep no predictions)
            self._forget = self._forget_prediction

    key_width = 2  # (key: a pair)

    def key(self, req: Request) -> Any:
        return (self.predict(req), req.arrival)

    def index_key(self, source: Any) -> Callable[[int], Any] | None:
        of_row, output, arrival = self.predict.of_row, source._output, source._arrival
        if self.predict.sigma == 0.0:  # (of_row: the true length; a whole number compares
            # as its float, and faster with the heap's other whole numbers)
            return lambda i: (output[i], arrival[i])
        return lambda i: (of_row(i, output[i]), arrival[i])

    def _forget_prediction(self, req: Request) -> None:
        """``req`` left the batch: drop its prediction if it finished (as :meth:`release`
        calls it)."""
        if req.num_output_tokens >= req.output_len:
            self.predict.forget(req)
