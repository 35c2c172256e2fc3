"""A policy's scenario parameters: the base class and the batch-slot field every policy shares."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field

from orcasim.params import ComponentParams


class PolicyParams(ComponentParams):
    """Base for a policy's scenario parameters."""


def slots_field(default: int = 32, description: str = "running sequences at most "
                "(batch slots; vLLM's max_num_seqs)") -> Any:
    """The batch-slot capacity field: ``max_batch``, also accepted as ``max_num_seqs``."""
    return Field(default, gt=0, description=description,
                 validation_alias=AliasChoices("max_batch", "max_num_seqs"))


def slot_capacity(params: ComponentParams) -> int | None:
    """The batch slots a policy's parameters allow (``None``: no limit)."""
    cap = getattr(params, "max_batch", None)
    return getattr(params, "max_num_seqs", None) if cap is None else cap
