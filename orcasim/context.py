"""The scheduler context: everything a policy sees, in one small object.

A policy reads the clock, the waiting queue, the running batch and the
events it can wait on here, and moves requests through their life cycle with
:meth:`admit`, :meth:`finish`, :meth:`reject` and :meth:`abort`, which keep
the request's timestamps and the recorder consistent.

Events a policy (or any helper process) can wait on, each created only when
someone asks for it, so an event nobody waits on costs nothing:

- :attr:`arrival`: a request arrived (and passed admission control);
- :attr:`slot_freed`: a running request finished, was aborted or preempted
  (``slots.freed``: :attr:`slots` is the engine's
  :class:`~orcasim.sched.slots.SlotPool`);
- :attr:`admitted`: a request joined the batch (what an idle engine waits on
  while an event-driven policy decides);
- :attr:`step_end`: the engine finished a step (a step boundary);
- :meth:`timer`: a timeout, e.g. to re-rank an aging queue;
- ``kv.freed``: KV memory was freed (:attr:`kv` is the
  :class:`~orcasim.kv.pool.KVPool` of the scenario's ``memory`` section, or an
  :class:`~orcasim.kv.unlimited.UnlimitedKV` without one).

:meth:`wake_event` combines the ones that can unblock an idle policy.

Preemption is counted here too (:meth:`preempted`, by reason), so every
policy reports ``num_preemptions`` the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from orcasim.kv.unlimited import UnlimitedKV
from orcasim.metrics.request_rows import DONE_BLOCK, RequestRows
from orcasim.request import FINAL_STATES, Request, RequestState
from orcasim.sched.slots import SlotPool

if TYPE_CHECKING:
    from orcasim.clients import Clients
    from orcasim.kv.pool import KVPool
    from orcasim.metrics.recorder import Recorder
    from orcasim.policies.base import Policy
    from orcasim.source import ArrivalSource

RUNNING = RequestState.RUNNING
FINISHED = RequestState.FINISHED

#: spawn key of the policies' random stream: independent of the workload's ``default_rng(seed)``
POLICY_RNG_STREAM = 1


class SchedulerContext:
    """The clock, the queues, the events and the life-cycle operations of one engine.

    ``waiting`` holds the requests that arrived and are not running. It is a
    deque (first come, first served) unless the policy replaces it with a queue
    of its own order (``append``, ``popleft``, ``remove``, ``clear``, ``len``
    and iteration, e.g. :class:`~orcasim.policies.queues.KeyedQueue`).
    """

    def __init__(self, env: simpy.Environment, recorder: Recorder, seed: int = 0,
                 rng_key: tuple[int, ...] = ()) -> None:
        self.env = env
        self.recorder = recorder
        self.seed = seed
        #: appended to the policies' spawn key: one stream per engine of a cluster
        self.rng_key = rng_key
        self.waiting: Any = deque()
        self.source: ArrivalSource | None = None
        self.policy: Policy | None = None
        #: KV memory: the scenario's pool, or an unlimited one without a memory section
        self.kv: KVPool | UnlimitedKV | Any = UnlimitedKV(env)
        #: batch slots; the policy sets the capacity (``max_num_seqs``)
        self.slots = SlotPool(env, None)
        #: the end of the step in flight (a request admitted before then starts then)
        self.busy_until = 0.0
        #: preemptions by reason (``kv_full``, ``priority``...)
        self.preemptions: dict[str, int] = {}
        self.num_recomputed_tokens = 0  # computed tokens lost to recompute preemptions
        #: ``(request) -> rejection reason or None``, called on every arrival (admission control)
        self.gate: Callable[[Request], str | None] | None = None
        self.last_step_end = 0.0  # end time of the engine's most recent step
        self.num_started = 0  # requests that have been scheduled at least once
        #: follows requests whose clients may give up (:class:`~orcasim.clients.Clients`)
        self.clients: Clients | None = None
        #: called with each request as it reaches its final state (closed-loop sources)
        self.on_end: Callable[[Request], None] | None = None
        #: called with each request as it first joins the batch (disaggregation's KV hold)
        self.on_admit: Callable[[Request], None] | None = None
        self._arrival: simpy.Event | None = None
        self._step_end: simpy.Event | None = None
        self._admitted: simpy.Event | None = None
        self._rng: np.random.Generator | None = None

    @property
    def now(self) -> float:
        return self.env.now

    @property
    def rng(self) -> np.random.Generator:
        """The run's generator for policies (e.g. noisy length predictions).

        Derived from the run's seed on a stream of its own, so drawing from it
        never changes the workload's requests.
        """
        if self._rng is None:
            ss = np.random.SeedSequence(self.seed, spawn_key=(POLICY_RNG_STREAM, *self.rng_key))
            self._rng = np.random.default_rng(ss)
        return self._rng

    @property
    def running(self) -> Iterable[Request]:
        """The requests holding a place in the running batch."""
        return () if self.policy is None else self.policy.running_requests()

    # -- events ------------------------------------------------------------
    @property
    def arrival(self) -> simpy.Event:
        """An event that fires at the next arrival (a fresh one after each arrival)."""
        ev = self._arrival
        if ev is None:
            ev = self._arrival = self.env.event()
            src = self.source
            if src is not None and src.lazy:
                src.arm()
        return ev

    @property
    def slot_freed(self) -> simpy.Event:
        """An event that fires when a running request next gives its slot back."""
        return self.slots.freed

    @property
    def admitted(self) -> simpy.Event:
        """An event that fires when the next request joins the batch."""
        ev = self._admitted
        if ev is None:
            ev = self._admitted = self.env.event()
        return ev

    @property
    def step_end(self) -> simpy.Event:
        """An event that fires at the end of the engine's next step (for helper processes)."""
        ev = self._step_end
        if ev is None:
            ev = self._step_end = self.env.event()
        return ev

    def timer(self, delay: float) -> simpy.Event:
        """An event that fires ``delay`` seconds from now."""
        return self.env.timeout(delay)

    def wake_event(self, timeout: float | None = None) -> simpy.Event:
        """What an idle policy waits on: the next arrival, freed KV memory, or ``timeout``.

        With event-driven policy processes, also the next admission (a process
        may admit while the engine is idle).
        """
        ev: simpy.Event = self.arrival
        kv = self.kv
        if kv.limited:
            ev = ev | kv.freed
        policy = self.policy
        if policy is not None and policy.event_driven:
            ev = ev | self.admitted
        if timeout is not None:
            ev = ev | self.env.timeout(timeout)
        return ev

    @staticmethod
    def _fire(ev: simpy.Event | None) -> None:
        if ev is not None and not ev.triggered:
            ev.succeed()

    # -- arrivals ------------------------------------------------------------
    @property
    def arrivals_done(self) -> bool:
        """True once no more requests will arrive."""
        return self.source is None or self.source.exhausted

    def poll_arrivals(self) -> None:
        """Deliver every request whose arrival time is <= now.

        Policies call this at a step boundary so that a request arriving at
        exactly the boundary is seen by it, whatever the order in which the
        simulator processes simultaneous events.
        """
        src = self.source
        if src is not None:
            now = self.env._now  # the clock, read directly: once per step boundary
            if src.pending_until(now):
                src.flush(now)

    def submit(self, req: Request) -> None:
        """A request arrives: admission control, then queue it and wake a waiting policy."""
        gate = self.gate
        if gate is not None:
            reason = gate(req)
            if reason is not None:
                self.refuse(req, reason)
                return
        self.recorder.num_arrived += 1
        self.waiting.append(req)
        if self.clients is not None:
            self.clients.watch(req)
        ev, self._arrival = self._arrival, None
        self._fire(ev)

    def refuse(self, req: Request, reason: str) -> None:
        """A request arrives and is turned away at once (admission control, the API server)."""
        self.recorder.num_arrived += 1
        self.reject(req, reason)
        if self.arrivals_done:  # the last arrival: let an idle policy see the end
            ev, self._arrival = self._arrival, None
            self._fire(ev)

    def released(self, count: int) -> None:
        """A lazy source released ``count`` requests into its backlog (``waiting``)."""
        if count:
            self.recorder.num_arrived += count
            ev, self._arrival = self._arrival, None
            self._fire(ev)

    def arrivals_ended(self) -> None:
        """Wake a policy waiting on :attr:`arrival` without a request, so it sees that
        arrivals are done (a cluster's router sent the last request to another engine)."""
        ev, self._arrival = self._arrival, None
        self._fire(ev)

    # -- life cycle ------------------------------------------------------------
    def admit(self, req: Request) -> None:
        """``req`` joins the running batch: it takes a batch slot and runs from the next step.

        A request admitted while a step is in flight starts when that step
        ends (its ``first_scheduled`` time).
        """
        if req.state != RUNNING:  # (SlotPool.admit: a reserved slot, or a free one)
            slots = self.slots
            if slots.reserved:
                slots.reserved -= 1
            elif slots.count < slots.capacity:
                slots.count += 1
            else:
                slots.admit(req)  # (raises: every slot is taken)
        req.state = RUNNING
        if req.first_scheduled is None:
            now = self.env._now
            req.first_scheduled = now if self.busy_until <= now else self.busy_until
            self.num_started += 1
        if self.on_admit is not None:
            self.on_admit(req)
        ev = self._admitted
        if ev is not None:
            self._admitted = None
            ev.succeed(req)

    def preempted(self, req: Request, reason: str, recompute: int = 0) -> None:
        """Running ``req`` leaves the batch before finishing (the policy requeues it).

        Gives its slot back, counts the preemption under ``reason`` and marks
        the request ``PREEMPTED``; the policy has freed (or swapped) its memory.
        ``recompute``: computed tokens it lost, which it will compute again.
        """
        if req.state == RequestState.RUNNING:
            self.slots.release()
        req.state = RequestState.PREEMPTED
        req.num_preemptions += 1
        self.preemptions[reason] = self.preemptions.get(reason, 0) + 1
        self.num_recomputed_tokens += recompute

    def preemption_summary(self) -> dict[str, int]:
        """``num_preemptions``, ``num_preemptions_<reason>`` and ``num_recomputed_tokens``."""
        out = {"num_preemptions": sum(self.preemptions.values()),
               "num_recomputed_tokens": self.num_recomputed_tokens}
        for reason, n in sorted(self.preemptions.items()):
            out[f"num_preemptions_{reason}"] = n
        return out

    def finish(self, req: Request, t: float) -> None:
        """``req`` emitted its last token at ``t``."""
        self.finish_all((req,), t)

    def finish_one(self, req: Request, t: float) -> None:
        """:meth:`finish` of ``req``, without a sequence in between when it is running, was
        scheduled and emitted a first token (a run's finisher) and nobody acts on its end
        (as :meth:`finish_all` finds)."""
        slots = self.slots
        rec = self.recorder
        if (req.state == RUNNING and self.on_end is None and not slots._getters
                and slots._freed is None and req.first_token is not None
                and req.first_scheduled is not None and "record_request" not in rec.__dict__
                and type(rec).record_request is RequestRows.record_request):
            slots.count -= 1
            req.state = FINISHED
            req.finish = req.last_token = t
            done = rec._done  # (RequestRows.record_finished)
            done.append(req)
            if len(done) >= DONE_BLOCK:
                rec._write_done()
            return
        self.finish_all((req,), t)

    def finish_all(self, reqs: Sequence[Request], t: float) -> None:
        """``reqs`` emitted their last token at ``t``, in order: each gives its slot back (if
        running), is finished and recorded, then the end callback sees it."""
        slots = self.slots
        rec = self.recorder
        on_end = self.on_end
        if (on_end is None and not slots._getters and slots._freed is None
                and "record_request" not in rec.__dict__
                and type(rec).record_request is RequestRows.record_request):
            # nobody acts on a slot given back or an end: the rows are held and written a
            # block at a time (RequestRows.record_finished), as record_request writes them
            running = 0
            plain = True  # every one was scheduled and emitted a token (the rows it holds)
            for req in reqs:
                if req.state == RUNNING:
                    running += 1
                req.state = FINISHED
                req.finish = req.last_token = t
                if req.first_token is None or req.first_scheduled is None:
                    plain = False
            slots.count -= running
            if plain:
                rec.record_finished(reqs)  # type: ignore[arg-type]
            else:
                for req in reqs:
                    rec.record_request(req)
            return
        release = slots.release
        record = rec.record_request
        for req in reqs:
            if req.state == RUNNING:
                release()
            req.state = FINISHED
            req.finish = req.last_token = t
            record(req)
            if on_end is not None:
                on_end(req)

    def reject(self, req: Request, reason: str) -> None:
        """``req`` is turned away without running (admission control, capacity)."""
        req.state = RequestState.REJECTED
        req.reason = reason
        self._ended(req)

    def abort(self, req: Request, reason: str) -> None:
        """``req`` ends before finishing (hard stop, horizon)."""
        was_running = req.state == RequestState.RUNNING
        req.state = RequestState.ABORTED
        req.reason = reason
        req.finish = self.env.now
        self._ended(req)
        if was_running:
            self.slots.release()

    def cancel(self, req: Request, reason: str) -> None:
        """Abort ``req`` wherever it is (queue, batch, swap space), freeing its slot and memory.

        A request cancelled while a step of it is in flight loses that step's
        part. Nothing happens to a request already in a final state.
        """
        if req.state in FINAL_STATES:
            return
        assert self.policy is not None
        self.policy.cancel(req)
        self.abort(req, reason)

    def _ended(self, req: Request) -> None:
        self.recorder.record_request(req)
        if self.on_end is not None:
            self.on_end(req)

    def end_step(self, t: float) -> None:
        """The engine finished a step at ``t`` (called by the engine)."""
        self.last_step_end = t
        ev, self._step_end = self._step_end, None
        self._fire(ev)
