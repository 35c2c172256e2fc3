"""``class-share``: weighted shares of the engine between request classes.

Each class has a virtual counter of the tokens its requests were served
(prompt and output tokens, divided by the class's weight); when the batch
has room, the next request comes from the backlogged class with the smallest
counter (see :mod:`orcasim.policies.fair`). While both are backlogged, a
class of weight 4 gets four times the tokens of a class of weight 1; an idle
class's share goes to the others. Within a class: first come, first served.
"""

from __future__ import annotations

from pydantic import Field

from orcasim.policies.fair import FairParams, FairSharePolicy
from orcasim.registry import policies


@policies.register("class-share")
class ClassShare(FairSharePolicy):
    """Weighted token shares between request classes (virtual counters per class)."""

    group_attr = "cls"

    class Params(FairParams):
        w_output: float = Field(1.0, ge=0, description="counter cost of an output token")
