"""The latency-model interface."""

from __future__ import annotations

from typing import ClassVar

from orcasim.params import ComponentParams
from orcasim.plan import StepPlan


class LatencyModel:
    """Maps a step's batch to its duration in seconds.

    Subclasses declare ``Params`` and implement :meth:`step_time`. The engine
    calls ``step_time`` once per step, so it must be cheap.
    """

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def step_time(self, plan: StepPlan) -> float:
        """Seconds taken by one step executing ``plan``."""
        raise NotImplementedError
