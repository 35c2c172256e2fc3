"""Linear and constant step-latency models.

``linear`` is the seed notebook's calibrated model::

    step_latency(B, T) = base + per_seq * B + per_token * T

with B the sequences in the batch and T the KV tokens the step reads
(defaults 5 ms, 0.8 ms, 0.02 ms). When a policy computes prompt tokens in a
step (prefill), ``per_prefill_token`` charges each of them as well; it is 0 in
the notebook's model, where prompts are treated as already cached.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.latency.base import LatencyModel
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models


@latency_models.register("linear")
class LinearLatency(LatencyModel):
    """``base + per_seq*B + per_token*T (+ per_prefill_token*prefill tokens)`` seconds."""

    class Params(ComponentParams):
        base: float = Field(0.005, ge=0, description="fixed cost per step, seconds")
        per_seq: float = Field(0.0008, ge=0, description="cost per sequence in the batch, s")
        per_token: float = Field(0.00002, ge=0, description="cost per KV token read, s")
        per_prefill_token: float = Field(0.0, ge=0, description="cost per prompt token computed, s")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.base = params.base
        self.per_seq = params.per_seq
        self.per_token = params.per_token
        self.per_prefill_token = params.per_prefill_token

    def step_time(self, plan: StepPlan) -> float:
        t = self.base + self.per_seq * plan.num_seqs + self.per_token * plan.num_kv_tokens
        if plan.num_prefill_tokens and self.per_prefill_token:
            t += self.per_prefill_token * plan.num_prefill_tokens
        return t

    def __call__(self, num_seqs: int, num_kv_tokens: int) -> float:
        """The notebook's ``step_latency(B, T)``."""
        return self.base + self.per_seq * num_seqs + self.per_token * num_kv_tokens


@latency_models.register("constant")
class ConstantLatency(LatencyModel):
    """Every step takes ``step_time`` seconds (worked examples, step-clock runs)."""

    class Params(ComponentParams):
        step_time: float = Field(1.0, gt=0, description="seconds per step")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self._t = params.step_time

    def step_time(self, plan: StepPlan) -> float:
        return self._t
