"""``edf``: earliest deadline first, on per-request deadlines.

A request's deadline is ``arrival + deadline`` (the workload's ``deadline``
attribute, seconds after arrival; ``default_deadline`` for requests without
one, else they go after every request with a deadline). Waiting requests are
admitted earliest deadline first; with ``preempt: true`` a full batch
preempts its latest-deadline request for a waiting one due earlier.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import Field

from orcasim.context import SchedulerContext
from orcasim.policies.common import TokenParams
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.keys import row_columns
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("edf")
class EDF(KeyedPolicy):
    """Earliest absolute deadline (arrival + deadline) first."""

    runs_unchanged = True  # static keys: a full batch's victim cannot change between arrivals

    class Params(TokenParams):
        preempt: bool = Field(False, description="preempt later deadlines when the batch is full")
        default_deadline: float | None = Field(
            None, gt=0, description="deadline (s after arrival) of requests without one")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        self.default_deadline = params.default_deadline
        super().__init__(params, ctx)

    key_width = 2  # (key: a pair)

    def key(self, req: Request) -> Any:
        d = req.deadline if req.deadline is not None else self.default_deadline
        return (req.arrival + d if d is not None else math.inf, req.arrival)

    def index_key(self, source: Any) -> Callable[[int], Any] | None:
        deadline, arrival = row_columns(source).get("deadline"), source._arrival
        default = self.default_deadline

        def of_row(i: int) -> Any:
            d = deadline[i] if deadline is not None else None
            if d is None:
                d = default
            return (arrival[i] + d if d is not None else math.inf, arrival[i])

        return of_row
