"""``srpt``: shortest remaining (predicted) processing time first, preemptive.

A request's remaining time is its predicted output length (true, or with a
lognormal error ``sigma``; see ``sjf``) minus the tokens it has generated.
Waiting requests are admitted by it; when the batch is full, the running
request with the longest remaining time is preempted (by recompute) for a
waiting one with a strictly shorter remaining time. A request that outlives
its prediction has 0 left and is never preempted.
"""

from __future__ import annotations

from typing import Any

from orcasim.context import SchedulerContext
from orcasim.policies.keys import KeyCache
from orcasim.policies.sjf import SJF, LengthParams
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("srpt")
class SRPT(SJF):
    """Shortest remaining (predicted) output first; preempts longer running requests."""

    Params = LengthParams

    def __init__(self, params: LengthParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.preemptive = True
        self._preds = preds = KeyCache(self.predict)

        def rank(req: Request) -> Any:  # key(), with the prediction looked up
            left = preds[req] - req.num_output_tokens
            return (left if left > 0.0 else 0.0, req.arrival)

        self.rank = rank

    static_keys = False  # the remaining length shrinks as it decodes
    lazy_decodes = False  # its order reads the running requests' output tokens

    def key(self, req: Request) -> Any:
        return (max(self.predict(req) - req.num_output_tokens, 0.0), req.arrival)

    def release(self, req: Request) -> None:
        super().release(req)
        self._preds.pop(req, None)
