"""A workload written out request by request in the scenario file."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.registry import workloads
from orcasim.workload.base import (
    LIMITS_NOTE,
    MAX_PRIORITY,
    MAX_REQUESTS_PER_RUN,
    MAX_SECONDS,
    MAX_TOKENS_PER_REQUEST,
    Seconds,
    TokenCount,
    Workload,
    WorkloadArrays,
)


class RequestSpec(ComponentParams):
    """One request of a ``list`` workload."""

    name: str | None = Field(None, description="label shown in tables (default: its index)")
    arrival: Seconds = Field(0.0, description="arrival time, s (at most 1e9)")
    prompt_len: TokenCount = Field(description=f"prompt tokens ({LIMITS_NOTE})")
    output_len: int = Field(ge=1, le=MAX_TOKENS_PER_REQUEST, description="output tokens, "
                            f"at least 1 ({LIMITS_NOTE})")
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="lower is served "
                          "first (within +-1e9)")
    cls: str | None = Field(None, description="traffic class, e.g. interactive or batch")
    tenant: str | None = None
    deadline: float | None = Field(None, gt=0, le=MAX_SECONDS, description="latency target, "
                                   "s after arrival")
    prefix_id: str | None = Field(None, description="requests with the same id share a prefix")
    prefix_len: TokenCount = Field(0, description="tokens of the shared prefix")
    patience: float | None = Field(None, gt=0, le=MAX_SECONDS, description="the client gives "
                                   "up without a first token this many seconds after arrival")
    timeout: float | None = Field(None, gt=0, le=MAX_SECONDS, description="the client gives up "
                                  "if the request has not finished this many seconds after "
                                  "arrival")


@workloads.register("list")
class ListWorkload(Workload):
    """The requests given in ``requests``, in arrival order (ties keep file order)."""

    class Params(ComponentParams):
        requests: list[RequestSpec] = Field(min_length=1, max_length=MAX_REQUESTS_PER_RUN)

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        reqs = sorted(self.params.requests, key=lambda r: r.arrival)
        attrs: dict[str, list] = {
            "name": [r.name if r.name is not None else str(i) for i, r in enumerate(reqs)],
            "priority": [r.priority for r in reqs],
        }
        for key in ("cls", "tenant", "deadline", "prefix_id", "prefix_len", "patience",
                    "timeout"):
            col = [getattr(r, key) for r in reqs]
            if any(v not in (None, 0) for v in col):
                attrs[key] = col
        return WorkloadArrays(
            arrival=np.array([r.arrival for r in reqs], dtype=np.float64),
            prompt_len=np.array([r.prompt_len for r in reqs], dtype=np.int64),
            output_len=np.array([r.output_len for r in reqs], dtype=np.int64),
            attrs=attrs,
        )
