"""Load stages as a load generator runs them: one after another, each once the last has drained.

A benchmark client such as inference-perf runs its load stages in sequence:
it sends a stage's requests at their scheduled offsets from the stage's
start, waits until every one of them has ended (polling once a second),
pauses ``interval`` seconds, and starts the next stage one second later
(the lead it gives its workers). It also keeps at most ``max_concurrency``
requests in flight, and a multi-turn user sends round ``r`` only after round
``r - 1`` has ended. So when a request is sent depends on the run:

    origin[0]     = 0
    origin[k + 1] = q[k] + ceil(last end of stage k - q[k]) + interval + 1,  q[k] = origin[k] - 1
    sent[i]       = max(origin[stage i] + offset[i], end of prev[i], a free concurrency slot)

:class:`StagedRelease` holds those inputs as plain columns (it is part of a
workload's :class:`~orcasim.workload.base.WorkloadArrays`);
:class:`StagedSource` is the SimPy process that releases the requests. A
request's recorded arrival is the time it is sent, as the client measures
its latencies from there. Every request still ends in exactly one state.

With ``resend_failed``, a request whose ``prev`` failed (rejected or
aborted) is a conversation round sent on a history that does not hold the
failed round: it sends the failed round's prompt again (its length and
block hashes), and every later round of that conversation the round after
the one its predecessor sent, as inference-perf's multi-turn sessions do.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import simpy

from orcasim.context import SchedulerContext
from orcasim.request import Request, RequestState
from orcasim.source import OpenLoopSource, delay_until
from orcasim.workload.base import WorkloadArrays


@dataclass(frozen=True)
class StagedRelease:
    """When each request of a staged workload may be sent (see the module docstring).

    ``stage`` (sorted) and ``offset`` (seconds from the stage's start, sorted
    within a stage) give the schedule, ``counts`` the requests of each stage
    (a stage may have none: it ends as it starts); ``prev`` the request that must end
    first (-1: none); ``interval`` the pause between stages; ``lead`` the time
    from a stage's queueing to its start; ``poll`` how often the end of a stage
    is checked; ``max_concurrency`` the most requests in flight (0: no limit);
    ``resend_failed``: a conversation's failed rounds stay out of its history.
    """

    stage: np.ndarray
    offset: np.ndarray
    prev: np.ndarray
    counts: tuple[int, ...]
    interval: float = 1.0
    lead: float = 1.0
    poll: float = 1.0
    max_concurrency: int = 0
    resend_failed: bool = False

    def next_origin(self, origin: float, last_end: float | None) -> float:
        """The start of the next stage, given this one's start and its last request's end
        (None: the stage had no request)."""
        queued = origin - self.lead
        if last_end is None:
            last_end = queued
        if self.poll > 0:
            seen = queued + self.poll * math.ceil((last_end - queued) / self.poll)
        else:
            seen = last_end
        return seen + self.interval + self.lead

    def nominal_origins(self) -> list[float]:
        """Stage starts if every stage drained by its last scheduled send (a lower bound)."""
        out = [0.0]
        for k, c in enumerate(self.counts[:-1]):
            last = out[-1] + float(self.offset[self.stage == k].max()) if c else None
            out.append(self.next_origin(out[-1], last))
        return out

    def origins(self, finish: np.ndarray) -> list[float]:
        """The stage starts of a finished run, from each request's end time (by index)."""
        out = [0.0]
        for k, c in enumerate(self.counts[:-1]):
            last = float(np.max(finish[self.stage == k])) if c else None
            out.append(self.next_origin(out[-1], last))
        return out

    def source(self, env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays
               ) -> StagedSource:
        return StagedSource(env, ctx, arrays, self)


class StagedSource(OpenLoopSource):
    """Releases a staged workload's requests (see :class:`StagedRelease`)."""

    def __init__(self, env: simpy.Environment, ctx: SchedulerContext, arrays: WorkloadArrays,
                 release: StagedRelease) -> None:
        self.rel = release
        stage = release.stage.tolist()
        self._offset: list[float] = release.offset.tolist()
        self._prev: list[int] = release.prev.tolist()
        self._bounds = [0, *np.cumsum(release.counts).tolist()]
        self._left = list(release.counts)
        self._stage_of = stage
        self._origin = 0.0
        self._current = 0
        self._due: list[tuple[float, int]] = []  # (scheduled time, index)
        self._held: deque[int] = deque()  # waiting for a concurrency slot
        self._blocked: dict[int, int] = {}  # prev index -> the request waiting for it
        self._ended = bytearray(len(stage))
        self._failed = bytearray(len(stage))
        # the workload row each request sends (itself unless a round before it failed)
        self._row: list[int] = list(range(len(stage)))
        self._after: dict[int, int] = {p: i for i, p in enumerate(self._prev) if p >= 0}
        self._in_flight = 0
        self._submitted = 0
        self.origins: list[float] = []
        super().__init__(env, ctx, arrays)
        ctx.on_end = self._on_end

    @property
    def exhausted(self) -> bool:
        return self._submitted >= self._n

    def next_arrival(self) -> float | None:
        return self._due[0][0] if self._due else None

    def pending_until(self, now: float) -> bool:
        return bool(self._due) and self._due[0][0] <= now

    def run(self) -> Generator[simpy.Event, None, None]:
        if self._n:
            self._start_stage(0, 0.0)
        return
        yield  # a process needs a generator

    def _start_stage(self, k: int, origin: float) -> None:
        while not self._left[k] and k + 1 < len(self._left):  # a stage with no request
            self.origins.append(origin)
            k, origin = k + 1, self.rel.next_origin(origin, None)
        self._current, self._origin = k, origin
        self.origins.append(origin)
        lo, hi = self._bounds[k], self._bounds[k + 1]
        due, offset = self._due, self._offset
        for i in range(lo, hi):
            heapq.heappush(due, (origin + offset[i], i))
        times = sorted({origin + offset[i] for i in range(lo, hi)})
        now = self.env.now
        for t in times:
            self.env.timeout(delay_until(now, t)).callbacks.append(self._wake)

    def _wake(self, _event: simpy.Event) -> None:
        if self.pending_until(self.env.now):
            self.flush(self.env.now)

    def flush(self, now: float) -> None:
        """Send every request due by ``now`` that has a slot and no unfinished predecessor."""
        due, held, cap = self._due, self._held, self.rel.max_concurrency
        while due and due[0][0] <= now:
            _, i = heapq.heappop(due)
            if cap and (held or self._in_flight >= cap):
                held.append(i)
            else:
                self._take_slot(i, now)

    def _take_slot(self, i: int, now: float) -> None:
        self._in_flight += 1
        p = self._prev[i]
        if p >= 0 and not self._ended[p]:
            self._blocked[p] = i  # holds its slot while it waits, as the client does
        else:
            self._send(i, now)

    def _send(self, i: int, now: float) -> None:
        self._submitted += 1
        req = self._request(i, now)
        p = self._prev[i]
        if self.rel.resend_failed and p >= 0:
            # a failed round leaves the history as it was: this round sends that round's
            # prompt again; after a success it sends the round after the one p sent
            row = self._row[p] if self._failed[p] else self._after[self._row[p]]
            self._row[i] = row
            if row != i:
                req.prompt_len = self._prompt[row]
                for key, col in self._attrs:
                    if key == "hash_ids":
                        req.hash_ids = col[row]
        self.ctx.submit(req)

    def _on_end(self, req: Request) -> None:
        i = req.id
        now = self.env.now
        self._ended[i] = 1
        if req.state != RequestState.FINISHED:
            self._failed[i] = 1
        self._in_flight -= 1
        nxt = self._blocked.pop(i, None)
        if nxt is not None:
            self._send(nxt, now)
        cap, held = self.rel.max_concurrency, self._held
        while held and self._in_flight < cap:
            self._take_slot(held.popleft(), now)
        k = self._stage_of[i]
        self._left[k] -= 1
        if self._left[k] == 0 and k + 1 < len(self._left):
            self._start_stage(k + 1, self.rel.next_origin(self._origin, now))
