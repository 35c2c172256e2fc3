"""The workload interface, the arrays every workload produces, and the limits on them.

The limits keep every run finite and its numbers exact: a request has at
most :data:`MAX_TOKENS_PER_REQUEST` prompt and output tokens each, a run at
most :data:`MAX_REQUESTS_PER_RUN` requests, and every time (an arrival, a
think time, a time parameter) is at most :data:`MAX_SECONDS`, so float
seconds keep sub-microsecond resolution. Scenario fields state them in their
descriptions and refuse larger values when the scenario is loaded; drawn and
traced values are checked when the workload is generated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import Field, ValidationError

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.params import ComponentParams
from orcasim.request import Request

#: the most tokens a request's prompt, or its output, may have
MAX_TOKENS_PER_REQUEST = 10_000_000
#: the most requests one run may have (after a trace's window)
MAX_REQUESTS_PER_RUN = 100_000_000
#: the latest time any arrival, think time or time parameter may reach, s (about 31.7 years)
MAX_SECONDS = 1e9
#: the highest arrival rate a workload may ask for, requests per second
MAX_RATE = 1e6
#: the largest priority magnitude (a lower priority value is served first)
MAX_PRIORITY = 1_000_000_000

#: a token count: a whole number in ``[0, MAX_TOKENS_PER_REQUEST]``
TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS_PER_REQUEST)]
#: a number of requests: a whole number in ``[1, MAX_REQUESTS_PER_RUN]``
RequestCount = Annotated[int, Field(gt=0, le=MAX_REQUESTS_PER_RUN)]
#: a time: a finite number of seconds in ``[0, MAX_SECONDS]``
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
#: a duration that must pass: a finite number of seconds in ``(0, MAX_SECONDS]``
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
#: an arrival rate: a finite number of requests per second, > 0
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: any finite float (no NaN, no infinity)
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

#: the token limit, as field descriptions state it
LIMITS_NOTE = (f"at most {MAX_TOKENS_PER_REQUEST:,} tokens per request "
               "(MAX_TOKENS_PER_REQUEST)")
#: the token limit, as error messages state it ("... is more than TOKEN_LIMIT")
TOKEN_LIMIT = (f"the limit of {MAX_TOKENS_PER_REQUEST:,} tokens per request "
               "(MAX_TOKENS_PER_REQUEST)")


def field_error(loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A pydantic error at ``loc`` (relative to the field or model being validated).

    Raised from a validator, its location is appended to the validator's, so
    the scenario error names the exact field (``workload.output_len.value``)
    rather than the model holding it.
    """
    from pydantic_core import PydanticCustomError

    return ValidationError.from_exception_data(
        "limits", [{"type": PydanticCustomError("value_error", message), "loc": loc,
                    "input": value}])


def check_items(values: Sequence[Any], name: str, lo: float, hi: float, *,
                above_lo: bool = False) -> None:
    """Raise a pydantic error at ``name.i`` for the first item not a finite number in range.

    The range is ``[lo, hi]`` (``(lo, hi]`` with ``above_lo``). For list
    fields, whose item constraints the scenario reference would not show.
    """
    for i, v in enumerate(values):
        finite = isinstance(v, int) or math.isfinite(v)
        low_ok = v > lo if above_lo else v >= lo
        if not (finite and low_ok and v <= hi):
            bound = f"> {lo:g}" if above_lo else f">= {lo:g}"
            raise field_error((name, i), f"must be a finite number {bound} and <= {hi:g}", v)


def check_lengths(prompt: np.ndarray, output: np.ndarray, source: str) -> None:
    """Raise :class:`ScenarioError` for the first length beyond :data:`MAX_TOKENS_PER_REQUEST`."""
    for col, a in (("prompt_len", prompt), ("output_len", output)):
        bad = np.flatnonzero(a > MAX_TOKENS_PER_REQUEST)
        if bad.size:
            raise ScenarioError(source, f"request {bad[0]}: {col} {int(a[bad[0]])} is more than "
                                f"{TOKEN_LIMIT}")


@dataclass
class WorkloadArrays:
    """Requests as columns, sorted by arrival time (seconds from the start of the run).

    ``attrs`` holds optional per-request attributes by name, one value per
    request (``name``, ``priority``, ``cls``, ``tenant``, ``deadline``, ``n``,
    ``beam_width``, ``prefix_id``, ``prefix_len``, ``hash_ids``,
    ``hash_block_size``, ``session``: see :attr:`Request.WORKLOAD_ATTRS`).

    Closed-loop workloads (clients, multi-turn sessions) set ``after``: the
    index of the request whose end releases this one, ``think`` seconds
    later (-1: an open-loop request, released at ``arrival``). Such a
    request's ``arrival`` is NaN until the run fixes it. A request comes
    after an earlier index, so the chains have no cycles.

    A workload whose requests are sent by a rule of their own (load stages
    that wait for each other: :mod:`orcasim.staged_source`) sets ``release``,
    an object whose ``source(env, ctx, arrays)`` builds the SimPy source;
    ``arrival`` then holds the earliest possible times, and the source records
    the real ones.
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    attrs: dict[str, Sequence[Any]] = field(default_factory=dict)
    after: np.ndarray | None = None
    think: np.ndarray | None = None
    release: Any = None

    def __len__(self) -> int:
        return len(self.arrival)

    def check(self, source: str = "workload") -> None:
        """Raise :class:`OrcasimError` naming the first bad request, if any.

        Problems with the requests themselves (a length or time out of range)
        are :class:`ScenarioError`; malformed arrays from a custom workload
        are plain :class:`OrcasimError`.
        """
        n = len(self.arrival)
        for col in ("prompt_len", "output_len"):
            if len(getattr(self, col)) != n:
                raise OrcasimError(f"{source}: {col} has {len(getattr(self, col))} rows, "
                                   f"arrival has {n}")
        if n == 0:
            raise ScenarioError(source, "the workload has no requests")
        if n > MAX_REQUESTS_PER_RUN:
            raise ScenarioError(source, f"{n:,} requests, more than the limit of "
                                f"{MAX_REQUESTS_PER_RUN:,} per run (MAX_REQUESTS_PER_RUN)")
        for key, col in self.attrs.items():
            if key not in Request.WORKLOAD_ATTRS:
                raise OrcasimError(f"{source}: unknown request attribute {key!r}")
            if len(col) != n:
                raise OrcasimError(f"{source}: attribute {key} has {len(col)} rows, expected {n}")
        roots = np.arange(n)
        if self.after is not None or self.think is not None:
            roots = self._check_chains(source)
        arrival = self.arrival[roots]
        bad = np.flatnonzero(~np.isfinite(arrival) | (arrival < 0))
        if bad.size:
            raise ScenarioError(source, f"request {roots[bad[0]]}: arrival time "
                                f"{float(arrival[bad[0]])!r} is not a finite time >= 0")
        bad = np.flatnonzero(arrival > MAX_SECONDS)
        if bad.size:
            raise ScenarioError(source, f"request {roots[bad[0]]}: arrival time "
                                f"{float(arrival[bad[0]]):.6g} s is later than the limit of "
                                f"{MAX_SECONDS:g} s (MAX_SECONDS)")
        bad = np.flatnonzero(np.diff(arrival) < 0)
        if bad.size:
            raise OrcasimError(f"{source}: request {roots[bad[0] + 1]}: arrivals are not sorted")
        bad = np.flatnonzero(self.prompt_len < 0)
        if bad.size:
            raise ScenarioError(source, f"request {bad[0]}: negative prompt_len")
        bad = np.flatnonzero(self.output_len < 1)
        if bad.size:
            raise ScenarioError(source, f"request {bad[0]}: output_len must be >= 1")
        check_lengths(self.prompt_len, self.output_len, source)

    def _check_chains(self, source: str) -> np.ndarray:
        """Check ``after`` and ``think``; return the indices of the open-loop requests."""
        n = len(self.arrival)
        if self.after is None or self.think is None:
            raise OrcasimError(f"{source}: after and think must be given together")
        if len(self.after) != n or len(self.think) != n:
            raise OrcasimError(f"{source}: after and think need one value per request")
        idx = np.arange(n)
        dep = self.after >= 0
        bad = np.flatnonzero((self.after < -1) | (dep & (self.after >= idx)))
        if bad.size:
            raise OrcasimError(f"{source}: request {bad[0]}: it must come after an earlier "
                               f"request (after = {self.after[bad[0]]})")
        bad = np.flatnonzero(dep & ~(np.isfinite(self.think) & (self.think >= 0)))
        if bad.size:
            think = float(self.think[bad[0]])
            raise ScenarioError(source, f"request {bad[0]}: think time {think!r} is not a "
                                "finite time >= 0")
        if np.unique(self.after[dep]).size != int(dep.sum()):
            raise OrcasimError(f"{source}: a request releases at most one other request")
        return idx[~dep]


class Workload:
    """Produces :class:`WorkloadArrays` from its parameters and a random generator."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[ComponentParams]] = ComponentParams

    def __init__(self, params: ComponentParams) -> None:
        self.params = params

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        """Draw the requests. All randomness must come from ``rng``."""
        raise NotImplementedError
