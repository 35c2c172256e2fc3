"""Scenario events at given times: ``drain`` and ``hard_stop``.

- ``drain`` at ``t``: the engine stops accepting work. Requests arriving at
  or after ``t`` are rejected with reason ``draining``; requests already
  queued or running are served to the end.
- ``hard_stop`` at ``t``: the engine stops. The step in flight is lost, every
  running and waiting request is aborted with the event's ``reason``
  (default ``hard_stop``), and requests arriving at or after ``t`` are
  rejected with reason ``stopped``.

The rejection of later arrivals is decided by arrival time in the admission
gate, so it does not depend on the order of simultaneous events.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Literal

import simpy
from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.source import delay_until

if TYPE_CHECKING:
    from orcasim.engine import Engine


class ControlEvent(ComponentParams):
    """One scenario event: ``{type: drain | hard_stop, at: seconds}``."""

    type: Literal["drain", "hard_stop"] = Field(
        description="drain: reject later arrivals; hard_stop: abort everything in flight")
    at: float = Field(ge=0, description="time of the event, s")
    reason: str = Field("hard_stop", min_length=1,
                        description="abort reason of a hard stop's in-flight requests")


def first_time(events: Sequence[ControlEvent], kind: str) -> float:
    """The earliest time of an event of ``kind`` (inf if none)."""
    return min((e.at for e in events if e.type == kind), default=math.inf)


def control_process(
    env: simpy.Environment, engine: Engine, events: Sequence[ControlEvent]
) -> Generator[simpy.Event, None, None]:
    """Carry out the hard stops at their times (drains need only the admission gate)."""
    for ev in sorted((e for e in events if e.type == "hard_stop"), key=lambda e: e.at):
        if ev.at > env.now:
            yield env.timeout(delay_until(env.now, ev.at))
        if not engine.stopped:
            engine.stop(ev.reason)
