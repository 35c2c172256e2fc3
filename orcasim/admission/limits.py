"""``max_queue`` and ``token_bucket``: limits on how many requests may wait or arrive."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orcasim.admission.base import AdmissionController
from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.registry import admission
from orcasim.request import Request


@admission.register("max_queue")
class MaxQueue(AdmissionController):
    """Reject (``queue_full``) an arrival that finds ``limit`` requests waiting."""

    class Params(ComponentParams):
        limit: int = Field(ge=0, description="waiting requests at most")

    def check(self, req: Request) -> str | None:
        return "queue_full" if len(self.ctx.waiting) >= self.params.limit else None


class Bucket(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rate: float = Field(gt=0, description="tokens added per second")
    burst: float = Field(gt=0, description="bucket size (tokens it can hold)")


@admission.register("token_bucket")
class TokenBucket(AdmissionController):
    """A token-bucket rate limit per tenant; an arrival it cannot pay for is ``rate_limited``.

    Each tenant (requests without one share a bucket) has a bucket of
    ``burst`` tokens, full at the start, refilled at ``rate`` tokens per
    second. An admitted request takes 1 token (``cost: request``) or one per
    prompt token (``cost: prompt_tokens``). ``tenants`` sets other rates and
    sizes for named tenants.
    """

    class Params(ComponentParams):
        rate: float = Field(gt=0, description="tokens added per second, per tenant")
        burst: float = Field(gt=0, description="bucket size, per tenant")
        cost: str = Field("request", pattern="^(request|prompt_tokens)$",
                          description="what a request costs: request (1) or prompt_tokens")
        tenants: dict[str, Bucket] = Field(default_factory=dict,
                                           description="per-tenant {rate, burst} overrides")

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self._level: dict[str | None, float] = {}
        self._t: dict[str | None, float] = {}

    def _cost(self, req: Request) -> float:
        return 1.0 if self.params.cost == "request" else float(req.prompt_len)

    def _refill(self, tenant: str | None) -> float:
        p = self.params
        b = p.tenants.get(tenant) if tenant is not None else None
        rate, burst = (b.rate, b.burst) if b is not None else (p.rate, p.burst)
        now = self.ctx.now
        level = self._level.get(tenant, burst)
        level = min(burst, level + (now - self._t.get(tenant, now)) * rate)
        self._level[tenant] = level
        self._t[tenant] = now
        return level

    def check(self, req: Request) -> str | None:
        return "rate_limited" if self._refill(req.tenant) < self._cost(req) else None

    def accepted(self, req: Request) -> None:
        self._level[req.tenant] -= self._cost(req)
