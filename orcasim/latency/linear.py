"""Linear and constant step-latency models.

``linear`` is the seed notebook's calibrated model::

    step_latency(B, T) = base + per_seq * B + per_token * T

with B the sequences in the batch and T the KV tokens the step reads
(defaults 5 ms, 0.8 ms, 0.02 ms). When a policy computes prompt tokens in a
step (prefill), ``per_prefill_token`` charges each of them as well; it is 0 in
the notebook's model, where prompts are treated as already cached.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from orcasim.latency.base import Coefficient, LatencyModel
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models


@latency_models.register("linear")
class LinearLatency(LatencyModel):
    """``base + per_seq*B + per_token*T (+ per_prefill_token*prefill tokens)`` seconds."""

    class Params(ComponentParams):
        base: Coefficient = Field(0.005, description="fixed cost per step, seconds (finite, "
                                  "at most 3600: MAX_STEP_SECONDS, as every coefficient)")
        per_seq: Coefficient = Field(0.0008, description="cost per sequence in the batch, s")
        per_token: Coefficient = Field(0.00002, description="cost per KV token read, s")
        per_prefill_token: Coefficient = Field(0.0, description="cost per prompt token "
                                               "computed, s")

        @model_validator(mode="after")
        def _some_cost(self) -> LinearLatency.Params:
            if not (self.base or self.per_seq or self.per_token or self.per_prefill_token):
                raise PydanticCustomError("value_error", "every coefficient is 0: steps would "
                                          "take no time")
            if not (self.base or self.per_seq):
                raise PydanticCustomError("value_error", "base and per_seq are both 0: a step "
                                          "that reads no KV tokens would take no time; give "
                                          "one of them a value > 0")
            return self

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

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        # step_time adds left to right: (base + per_seq * B) + per_token * T
        return self.base + self.per_seq * num_seqs, self.per_token

    def __call__(self, num_seqs: int, num_kv_tokens: int) -> float:
        """The notebook's ``step_latency(B, T)``."""
        return self.base + self.per_seq * num_seqs + self.per_token * num_kv_tokens


@latency_models.register("constant")
class ConstantLatency(LatencyModel):
    """Every step takes ``step_time`` seconds (worked examples, step-clock runs)."""

    class Params(ComponentParams):
        step_time: Coefficient = Field(1.0, gt=0, description="seconds per step (finite, at "
                                       "most 3600: MAX_STEP_SECONDS)")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self._t = params.step_time

    def step_time(self, plan: StepPlan) -> float:
        return self._t
