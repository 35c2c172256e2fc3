"""The latency-model interface, and the limits on its coefficients.

Every coefficient is a finite number of seconds (or seconds per sequence,
per token) of at most :data:`MAX_STEP_SECONDS`, so a step's time stays
finite for any batch the limits on workloads allow, and every statistic of
a run is a finite number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ClassVar

from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.plan import StepPlan

#: the largest value of any latency coefficient (a step's fixed time, a cost per token), s
MAX_STEP_SECONDS = 3600.0

#: the batch of a dummy step (vLLM's ``execute_dummy_batch`` in a data-parallel group of an
#: MoE model: one sequence computing one token over a one-token context)
DUMMY_PLAN = StepPlan(1, 1, 0, 1)

#: a latency coefficient: finite, in ``[0, MAX_STEP_SECONDS]`` seconds
Coefficient = Annotated[float, Field(ge=0, le=MAX_STEP_SECONDS, allow_inf_nan=False)]


#: a run of decode steps timed at once (LatencyModel.decode_ends)
DecodeEnds = Callable[[float, float, int, int, float, list[float]], tuple[float, float]]


class LatencyModel:
    """Maps a step's batch to its duration in seconds.

    Subclasses declare ``Params`` and implement :meth:`step_time`. The engine
    calls ``step_time`` once per step, so it must be cheap.
    """

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams
    #: an all-decode plan that lists its requests takes exactly as long as the plan of its
    #: aggregates (sequences, KV tokens): the engine may then run such steps as a run
    decode_by_aggregates: ClassVar[bool] = False
    #: with ``decode_by_aggregates``, so does a plan of one-token decodes and one more
    #: sequence that computes one token or starts from an empty context (a fresh prompt)
    prefill_by_aggregates: ClassVar[bool] = False

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def step_time(self, plan: StepPlan) -> float:
        """Seconds taken by one step executing ``plan``."""
        raise NotImplementedError

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float] | None:
        """``(a, c)`` with ``step_time(StepPlan(num_seqs, T)) == a + c * T`` exactly (the same
        floating-point result) for every ``T``, or ``None``; lets the engine add up a run of
        decode steps without building plans."""
        return None

    def graph_tokens(self, tokens: int) -> tuple[int, bool]:
        """``(tokens computed, whether a captured CUDA graph runs them)`` for a step of
        ``tokens``: no padding and no graphs unless the model knows them."""
        return tokens, False

    def lockstep_time(self, plan: StepPlan | None, tokens: int, moe_tokens: float,
                      gather_tokens: int) -> float:
        """One engine's step in a data-parallel group stepping together, s (``plan`` None: a
        dummy step, :data:`DUMMY_PLAN`). ``tokens`` is what the dense operators compute
        (the group's padded count), ``moe_tokens`` the tokens per engine the MoE block
        sees, ``gather_tokens`` the largest engine's; this default knows none of them and
        costs the engine's own batch."""
        return self.step_time(plan if plan is not None else DUMMY_PLAN)

    def decode_step(self, num_seqs: int) -> Callable[[int], float] | None:
        """``f`` with ``f(T) == step_time(StepPlan(num_seqs, T))`` exactly for every ``T``, or
        ``None``: a model without :meth:`decode_coefficients` can still spare the engine a
        plan per step of a run. Like the coefficients, asked once per batch size and run."""
        return None

    def decode_ends(self, num_seqs: int) -> DecodeEnds | None:
        """``g`` that times a run of decode steps of ``num_seqs`` sequences at once, or
        ``None``. ``g(t, busy, kv, steps, limit, ends)`` adds ``steps`` steps from ``t``,
        the first reading ``kv`` KV tokens and each next ``num_seqs`` more, each timed as
        :meth:`decode_step`'s ``f`` (the same floats), appending each end to ``ends`` and
        its time to ``busy``, up to the first end at or after ``limit``; it returns ``(t,
        busy)`` after the last step taken, and raises SimulationError at a step time that is
        not positive. The engine's loop over ``f`` in one call (a call per step spared)."""
        return None
