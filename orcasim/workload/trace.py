"""``trace``: replay a trace file's requests, or pair its lengths with any arrival process."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator

from orcasim.errors import OrcasimError
from orcasim.registry import arrivals, workloads
from orcasim.spec import Nested
from orcasim.workload.arrivals import TraceWindow, replay_times
from orcasim.workload.attributes import ClassesField, apply_classes
from orcasim.workload.base import MAX_REQUESTS_PER_RUN, TokenCount, Workload, WorkloadArrays
from orcasim.workload.distributions import check_request_count, draw_arrivals
from orcasim.workload.traces import load_trace


@workloads.register("trace")
class TraceWorkload(Workload):
    """The requests of a trace: its arrival times (windowed, sped up) and lengths.

    With ``arrival`` set, the trace gives only the lengths, row by row (in
    file order, or shuffled with ``shuffle``), and the arrival process gives
    the times: this is how the length tables (ShareGPT, arXiv, BWB), which
    have no timestamps, are used. ``max_requests`` keeps the first rows.
    Mooncake traces carry ``hash_ids`` into the requests, so a prefix cache
    sees their real shared blocks. A ShareGPT JSON file gives one request per
    conversation, its first turn (as vLLM's benchmark does); use the
    ``sessions`` workload to replay every turn.
    """

    class Params(TraceWindow, ClassesField):
        max_requests: int | None = Field(None, gt=0, le=MAX_REQUESTS_PER_RUN, description="keep "
                                         "only the first rows (at most 100,000,000)")
        arrival: Annotated[Any, Nested(arrivals)] = Field(
            None, description="arrival process replacing the trace's times")
        shuffle: bool = Field(False, description="with arrival: take rows in random order")
        hash_block_size: TokenCount = Field(512, gt=0, description="tokens per hash_ids entry")
        tokenizer: str | None = Field(None, description="tokenizer.json for ShareGPT JSON text")

        @model_validator(mode="after")
        def _window_or_arrival(self) -> TraceWorkload.Params:
            if self.arrival is not None and (self.start or self.end is not None
                                             or self.speedup != 1.0 or self.rate is not None):
                raise ValueError("start, end, speedup and rate apply to the trace's own times; "
                                 "with an arrival process they have no effect")
            if self.shuffle and self.arrival is None:
                raise ValueError("shuffle needs an arrival process (the trace's times keep "
                                 "their rows)")
            return self

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        trace = load_trace(p.file, p.format, tokenizer=p.tokenizer,
                           hash_block_size=p.hash_block_size)
        src = trace.source
        if p.arrival is None:
            if trace.arrival is None:
                raise OrcasimError(f"{src}: this trace has no arrival times; give the workload "
                                   "an arrival process (workload.arrival)")
            rows, times = replay_times(trace.arrival, p, src, "workload")
            if p.max_requests is not None:
                rows, times = rows[: p.max_requests], times[: p.max_requests]
        else:
            rows = np.arange(len(trace))
            if trace.turn is not None:
                rows = rows[trace.turn == 0]
            if p.shuffle:
                rows = rng.permutation(rows)
            if p.max_requests is not None:
                if p.max_requests > len(rows):
                    raise OrcasimError(f"{src}: {len(rows)} rows, fewer than max_requests "
                                       f"({p.max_requests})")
                rows = rows[: p.max_requests]
            check_request_count(len(rows), "workload.max_requests")
            times = draw_arrivals(p.arrival, rng, len(rows), "workload.arrival")
        out = WorkloadArrays(
            arrival=np.asarray(times, dtype=np.float64),
            prompt_len=trace.prompt_len[rows].copy(),
            output_len=trace.output_len[rows].copy(),
        )
        if trace.hash_ids is not None:
            out.attrs["hash_ids"] = [trace.hash_ids[i] for i in rows.tolist()]
            out.attrs["hash_block_size"] = [trace.hash_block_size] * len(rows)
        return apply_classes(out, p.classes, rng)
