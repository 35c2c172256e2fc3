"""A synthetic workload: an arrival process and two length distributions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from orcasim.registry import arrivals, lengths, workloads
from orcasim.spec import Nested
from orcasim.workload.attributes import ClassesField, apply_classes
from orcasim.workload.base import Workload, WorkloadArrays

Column = Literal["arrival", "prompt_len", "output_len"]


@workloads.register("synthetic")
class Synthetic(Workload):
    """``num_requests`` requests with arrivals, prompt and output lengths drawn independently.

    The columns are drawn whole, in ``draw_order``; the default is the seed
    notebook's (arrivals, then output lengths, then prompt lengths), so the
    same seed gives the notebook's requests.
    """

    class Params(ClassesField):
        num_requests: int = Field(gt=0)
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

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        cols: dict[str, np.ndarray] = {}
        for col in p.draw_order:
            cols[col] = getattr(p, col).create().sample(rng, p.num_requests)
        out = WorkloadArrays(
            arrival=np.asarray(cols["arrival"], dtype=np.float64),
            prompt_len=np.asarray(cols["prompt_len"], dtype=np.int64),
            output_len=np.asarray(cols["output_len"], dtype=np.int64),
        )
        return apply_classes(out, p.classes, rng)
