"""A synthetic workload: an arrival process and two length distributions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from orcasim.registry import arrivals, lengths, workloads
from orcasim.spec import Nested
from orcasim.workload.attributes import ClassesField, apply_classes
from orcasim.workload.base import RequestCount, Workload, WorkloadArrays
from orcasim.workload.distributions import draw_arrivals, draw_lengths, refuse_empty_outputs

Column = Literal["arrival", "prompt_len", "output_len"]


@workloads.register("synthetic")
class Synthetic(Workload):
    """``num_requests`` requests with arrivals, prompt and output lengths drawn independently.

    The columns are drawn whole, in ``draw_order``; the default is the seed
    notebook's (arrivals, then output lengths, then prompt lengths), so the
    same seed gives the notebook's requests.
    """

    class Params(ClassesField):
        num_requests: RequestCount = Field(description="requests in the run (at most "
                                           "100,000,000: MAX_REQUESTS_PER_RUN)")
        arrival: Annotated[Any, Nested(arrivals)]
        prompt_len: Annotated[Any, Nested(lengths)]
        output_len: Annotated[Any, Nested(lengths)]
        draw_order: tuple[Column, Column, Column] = ("arrival", "output_len", "prompt_len")

        @field_validator("draw_order")
        @classmethod
        def _permutation(cls, v: tuple[str, ...]) -> tuple[str, ...]:
            if sorted(v) != sorted(("arrival", "prompt_len", "output_len")):
                raise ValueError("must name arrival, prompt_len and output_len once each")
            return v

        _outputs = field_validator("output_len")(refuse_empty_outputs)

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        cols: dict[str, np.ndarray] = {}
        for col in p.draw_order:
            spec, field = getattr(p, col), f"workload.{col}"
            n = p.num_requests
            cols[col] = draw_arrivals(spec, rng, n, field) if col == "arrival" else \
                draw_lengths(spec, rng, n, field)
        out = WorkloadArrays(
            arrival=np.asarray(cols["arrival"], dtype=np.float64),
            prompt_len=np.asarray(cols["prompt_len"], dtype=np.int64),
            output_len=np.asarray(cols["output_len"], dtype=np.int64),
        )
        return apply_classes(out, p.classes, rng)
