"""Request classes: priority, tenant, deadline, samples, beam width and shared prefix per request.

Any workload with a ``classes`` field assigns each request (or each session,
for multi-turn workloads) to one of the listed classes, at random in
proportion to ``weight``, after all its other columns are drawn, so adding
classes does not change the requests' arrivals or lengths. A single class
draws nothing. The class sets the request attributes that policies,
admission control and metrics read (see :attr:`Request.WORKLOAD_ATTRS`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, field_validator

from orcasim.errors import OrcasimError
from orcasim.params import ComponentParams
from orcasim.workload.base import (
    LIMITS_NOTE,
    MAX_PRIORITY,
    MAX_SECONDS,
    FiniteFloat,
    TokenCount,
    WorkloadArrays,
)


class RequestClass(ComponentParams):
    """One traffic class and the attributes of its requests."""

    name: str = Field(description="class name (Request.cls), e.g. interactive or batch")
    weight: FiniteFloat = Field(1.0, gt=0, le=1e9, description="relative share of requests "
                                "(at most 1e9)")
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="lower is served "
                          "first by priority policies (within +-1e9)")
    tenant: str | None = None
    deadline: float | None = Field(None, gt=0, le=MAX_SECONDS, description="latency target, "
                                   "s after arrival (at most 1e9)")
    n: int = Field(1, ge=1, description="parallel samples per request (only 1 is simulated)")
    beam_width: int = Field(1, ge=1, description="beams per request (only 1 is simulated)")
    prefix_id: str | None = Field(None, description="requests with this id share a prefix")
    prefix_len: TokenCount = Field(0, description="tokens of the shared prefix, added to "
                                   f"the front of each prompt ({LIMITS_NOTE})")


    @field_validator("n", "beam_width")
    @classmethod
    def _one_sequence(cls, v: int, info: Any) -> int:
        if v != 1:
            what = "parallel sampling (n > 1)" if info.field_name == "n" else \
                "beam search (beam_width > 1)"
            raise ValueError(f"{what} is not simulated by the schedulers, which decode one "
                             "sequence per request; its KV sharing is modelled by "
                             "python -m orcasim.studies.sharing")
        return v


class ClassesField(ComponentParams):
    """Mixin: the optional ``classes`` list of a workload."""

    classes: list[RequestClass] | None = Field(None, min_length=1,
                                               description="traffic classes, drawn by weight")

    @field_validator("classes")
    @classmethod
    def _unique(cls, v: list[RequestClass] | None) -> list[RequestClass] | None:
        if v is not None:
            names = [c.name for c in v]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"class names must be unique ({', '.join(sorted(dup))})")
            for c in v:
                if (c.prefix_id is None) != (c.prefix_len == 0):
                    raise ValueError(f"class {c.name}: give prefix_id and prefix_len together")
        return v


_DEFAULTS: dict[str, Any] = {"tenant": None, "deadline": None, "n": 1, "beam_width": 1,
                             "prefix_id": None, "prefix_len": 0}


def apply_classes(
    arrays: WorkloadArrays,
    classes: list[RequestClass] | None,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> WorkloadArrays:
    """Assign each request (or each group: a session's turns share a class) a class, in place.

    A class prefix is added to the front of its requests' prompts; it cannot
    be combined with a trace's ``hash_ids`` (their positions would shift).
    """
    if not classes:
        return arrays
    n = len(arrays)
    num_groups = n if groups is None else int(groups.max()) + 1
    if len(classes) == 1:
        pick = np.zeros(num_groups, dtype=np.int64)
    else:
        w = np.array([c.weight for c in classes], dtype=np.float64)
        pick = rng.choice(len(classes), size=num_groups, p=w / w.sum())
    if groups is not None:
        pick = pick[groups]
    chosen = [classes[k] for k in pick.tolist()]
    attrs = arrays.attrs
    attrs["cls"] = [c.name for c in chosen]
    attrs["priority"] = [c.priority for c in chosen]
    for key, default in _DEFAULTS.items():
        col = [getattr(c, key) for c in chosen]
        if any(v != default for v in col):
            attrs[key] = col
    prefix = np.array([c.prefix_len for c in chosen], dtype=np.int64)
    if prefix.any():
        if "hash_ids" in attrs:
            raise OrcasimError("a class prefix (prefix_len) cannot be combined with a trace's "
                               "hash_ids: the block positions would shift")
        arrays.prompt_len = arrays.prompt_len + prefix
    return arrays
