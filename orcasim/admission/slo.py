"""``slo_ttft``: reject a request whose predicted TTFT exceeds its deadline.

The prediction is a queueing estimate the controller can make online,
without knowing the policy: an arrival finds ``n`` requests waiting, and
requests have recently been starting at a rate ``r`` (first admissions per
second over the last ``window_s`` seconds), so it waits about ``n / r``;
``base_s`` adds the time from admission to the first token. The bound is the
request's own ``deadline`` (seconds after arrival), else ``ttft``; a request
with neither always passes. Until a window of history exists every request
passes.
"""

from __future__ import annotations

import math
from collections import deque

from pydantic import Field

from orcasim.admission.base import AdmissionController
from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.registry import admission
from orcasim.request import Request


@admission.register("slo_ttft")
class SLOTTFT(AdmissionController):
    """Reject (``slo_ttft``) when waiting / recent start rate + base_s > the TTFT bound."""

    class Params(ComponentParams):
        ttft: float | None = Field(None, gt=0, description="TTFT bound (s) of requests without "
                                   "a deadline")
        base_s: float = Field(0.0, ge=0, description="time from admission to first token, s")
        window_s: float = Field(10.0, gt=0, description="history for the start-rate estimate, s")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self._hist: deque[tuple[float, int]] = deque()

    def predicted_ttft(self) -> float | None:
        """The current estimate, or ``None`` before a window of history exists."""
        ctx = self.ctx
        now, started = ctx.now, ctx.num_started
        hist = self._hist
        hist.append((now, started))
        window = self.params.window_s
        while len(hist) > 1 and hist[1][0] <= now - window:
            hist.popleft()
        t0, s0 = hist[0]
        if now - t0 < window:
            return None
        n = len(ctx.waiting)
        if n == 0:
            return self.params.base_s
        rate = (started - s0) / (now - t0)
        return n / rate + self.params.base_s if rate > 0 else math.inf

    def check(self, req: Request) -> str | None:
        bound = req.deadline if req.deadline is not None else self.params.ttft
        pred = self.predicted_ttft()
        if bound is None or pred is None:
            return None
        return "slo_ttft" if pred > bound else None
