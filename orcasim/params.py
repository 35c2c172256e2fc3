"""Base class for the validated parameters of a component (policy, latency model, workload...).

Every registered component declares ``class Params(ComponentParams)``; the
scenario loader validates its section against it, so unknown keys and wrong
types are caught before a run starts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ComponentParams(BaseModel):
    """Strict, immutable parameters: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
