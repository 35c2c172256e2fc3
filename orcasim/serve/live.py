"""A scenario's engine running in real time, fed by requests that arrive while it runs.

:class:`LiveSimulation` builds one variant's model (policy, KV memory, latency
model, admission control) in a :class:`simpy.rt.RealtimeEnvironment` with
``strict=False`` and runs it on a thread of its own. Other threads hand it
requests with :meth:`LiveSimulation.submit` (and cancel them with
:meth:`LiveSimulation.cancel`): each becomes a request arriving at the
simulated time that corresponds to the wall clock when the simulation thread
receives it, so its queueing, batching, memory and preemption follow the
engine's model exactly as in an offline run.

The thread sleeps until the wall-clock time of the next simulated event, or
until a message arrives, whichever comes first; it never sleeps through a
message. After every engine step it reads how many tokens each running
request has emitted and reports the changed :class:`Ticket` objects in one
call of ``notify`` (from the simulation thread: the receiver hands them to its
own thread). *Lag* is the wall clock minus the simulated time when the thread
acts on a step end or an arrival: 0 when the simulation keeps up, growing
when the machine cannot simulate as fast as real time. A scenario's cluster
runs the same way in :class:`~orcasim.serve.live_cluster.LiveCluster`.
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy
import simpy.rt

from orcasim.metrics.results import VariantResult
from orcasim.policies.base import Policy
from orcasim.request import FINAL_STATES, Request, RequestState
from orcasim.scenario import VariantConfig
from orcasim.serve.metrics import ServeMetrics
from orcasim.simulation import Model, build_model, variant_result
from orcasim.source import ArrivalSource, delay_until
from orcasim.workload.base import WorkloadArrays

#: abort reason of a request whose HTTP client went away
CLIENT_DISCONNECTED = "client_disconnected"
#: abort reason of the requests in flight when the server stops
SHUTDOWN = "shutdown"
#: abort reason of the requests in flight when the simulation fails
SIMULATION_ERROR = "simulation_error"
#: simulated events processed after a stop at most (a policy timer that never ends)
MAX_EVENTS_AFTER_STOP = 1_000_000


class Ticket:
    """One request handed to the simulation, and what the simulation has told about it.

    Written by the simulation thread (``tokens``, ``state``, ``reason`` and the
    times, in simulated seconds) and read by the thread that submitted it after
    a ``notify``. ``waiter`` is free for the submitter (e.g. an asyncio event).
    """

    __slots__ = ("arrival", "finish", "finish_reason", "first_token", "last_token",
                 "output_len", "prompt_len", "reason", "req", "state", "tokens", "waiter")

    def __init__(self, prompt_len: int, output_len: int, waiter: Any = None,
                 finish_reason: str = "length") -> None:
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.waiter = waiter
        #: what a finished request reports (``length``: it stopped at ``max_tokens``)
        self.finish_reason = finish_reason
        self.req: Request | None = None
        self.tokens = 0
        self.state = RequestState.WAITING
        self.reason: str | None = None
        self.arrival = math.nan
        self.first_token = math.nan
        self.last_token = math.nan
        self.finish = math.nan

    @property
    def done(self) -> bool:
        """True once the request is finished, rejected or aborted."""
        return self.state in FINAL_STATES


class LiveSource(ArrivalSource):
    """``ctx.source`` of a live run: no scheduled arrivals, exhausted once the server stops."""

    #: requests are submitted as they come, never held in a backlog
    lazy = False

    def __init__(self) -> None:
        self.closed = False

    @property
    def exhausted(self) -> bool:
        return self.closed


def _no_requests() -> WorkloadArrays:
    empty = np.zeros(0)
    return WorkloadArrays(empty, empty.astype(np.int64), empty.astype(np.int64))


class LiveSimulation:
    """One variant's engine in real time on a thread, with requests submitted from outside.

    ``notify(tickets)`` is called on the simulation thread with the tickets
    whose tokens or state changed since the last call (one call per simulated
    event at most). ``factor``: wall seconds per simulated second.
    """

    def __init__(self, cfg: VariantConfig, *, seed: int,
                 notify: Callable[[list[Ticket]], None], factor: float = 1.0) -> None:
        self.cfg = cfg
        self.notify = notify
        self.env = simpy.rt.RealtimeEnvironment(factor=factor, strict=False)
        self.source = LiveSource()
        self._build(seed)
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, Ticket | None]] = deque()
        self._tickets: dict[int, Ticket] = {}  # request id -> ticket, while in flight
        self._changed: list[Ticket] = []
        self._failed = False  # the thread died: nothing more is queued
        self._last_step_end = 0.0
        self.num_submitted = 0
        self.metrics = ServeMetrics()
        self.lags = array("d")  # seconds, one per step end or arrival acted on
        self.prompt_tokens = 0  # prompts computed (counted at each first token)
        self.generation_tokens = 0  # tokens emitted
        self.stopping = False
        #: the wall clock (Unix seconds) at simulated time 0, once started: a served
        #: request's wall-clock time is ``start_unix + simulated time * factor``
        self.start_unix = math.nan
        self.result: VariantResult | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- other threads ---------------------------------------------------------------
    def start(self) -> None:
        """Start the simulation thread; simulated time 0 is now."""
        self._thread = threading.Thread(target=self._main, name="orcasim-sim", daemon=True)
        self.start_unix = time.time()
        self.env.sync()
        self._thread.start()

    def submit(self, ticket: Ticket) -> None:
        """Hand ``ticket``'s request to the simulation (it arrives when the thread sees it)."""
        self._post("submit", ticket)

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: abort the request wherever it is (``client_disconnected``)."""
        self._post("cancel", ticket)

    def stop(self) -> None:
        """Abort everything in flight (``shutdown``), reject later arrivals, end the thread."""
        self.stopping = True
        self._post("stop", None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True if it has."""
        return self._stopped.wait(timeout)

    def _build(self, seed: int) -> None:
        """Build the model in ``self.env``, fed by ``self.source``, ending in ``_ended``."""
        self.model: Model = build_model(self.cfg, _no_requests(), seed=seed, env=self.env,
                                        api_server=False)
        ctx = self.model.ctx
        ctx.source = self.source  # type: ignore[assignment]
        ctx.on_end = self._ended
        self._policy = self.model.policy
        self._batch = getattr(self._policy, "batch", None)  # decode-only policies count lazily

    def snapshot(self) -> dict[str, float]:
        """Current gauges for a metrics scrape (read without stopping the simulation)."""
        ctx = self.model.ctx
        running = ctx.slots.count - ctx.slots.reserved
        return {"running": float(running), "waiting": float(len(ctx.waiting)),
                "kv_usage": float(ctx.kv.usage),
                "preemptions": float(sum(ctx.preemptions.values())),
                "prompt_tokens": float(self.prompt_tokens),
                "generation_tokens": float(self.generation_tokens),
                "lag": self.lags[-1] if self.lags else 0.0}

    def _post(self, kind: str, ticket: Ticket | None) -> None:
        with self._cond:
            if not self._failed:
                self._inbox.append((kind, ticket))
                self._cond.notify()
                return
        if kind == "submit" and ticket is not None:  # the simulation has failed
            ticket.reason = SIMULATION_ERROR
            ticket.state = RequestState.ABORTED
            self.notify([ticket])

    # -- the simulation thread ----------------------------------------------------------
    def _sim_now(self) -> float:
        env = self.env
        return env.env_start + (time.monotonic() - env.real_start) / env.factor

    def _main(self) -> None:
        try:
            self._loop()
            self.result = self._finish()
        except BaseException as err:  # reported by the caller after join()
            self.error = err
            self._fail_in_flight()
        finally:
            self._stopped.set()

    def _fail_in_flight(self) -> None:
        """The simulation failed: end every request in flight (``simulation_error``) and
        refuse new ones, so that no client waits for ever."""
        self.stopping = True
        failed = list(self._tickets.values())
        self._tickets.clear()
        for ticket in failed:
            ticket.reason = SIMULATION_ERROR
            ticket.state = RequestState.ABORTED
        with self._cond:  # later submissions fail at once (see _post)
            self._failed = True
            queued = [t for kind, t in self._inbox if kind == "submit" and t is not None]
            self._inbox.clear()
        for ticket in queued:
            ticket.reason = SIMULATION_ERROR
            ticket.state = RequestState.ABORTED
        if failed or queued:
            self.notify(failed + queued)

    def _loop(self) -> None:
        env = self.env
        cond = self._cond
        inbox = self._inbox
        step = simpy.rt.RealtimeEnvironment.step
        while True:
            if inbox:
                with cond:
                    messages = list(inbox)
                    inbox.clear()
                self._receive(messages)
            t = env.peek()
            if t == math.inf:
                with cond:
                    if not inbox:
                        cond.wait(0.5)
                continue
            wait = env.real_start + (t - env.env_start) * env.factor - time.monotonic()
            if wait > 0:
                with cond:
                    if not inbox:
                        cond.wait(wait)
                continue
            step(env)
            self._after_event()
            if self._changed:
                changed, self._changed = self._changed, []
                self.notify(changed)
            if self.source.closed:
                return

    def _after_event(self) -> None:
        """After a simulated event: if the engine's step ended, measure lag, read tokens."""
        ctx = self.model.ctx
        if ctx.last_step_end != self._last_step_end:
            self._last_step_end = ctx.last_step_end
            self._lag()
            self._collect(self._policy)

    def _receive(self, messages: list[tuple[str, Ticket | None]]) -> None:
        """Schedule each message at the simulated time of now (never before ``env.now``)."""
        env = self.env
        for kind, ticket in messages:
            ev = env.timeout(delay_until(env.now, max(env.now, self._sim_now())))
            if kind == "submit":
                ev.callbacks.append(lambda _e, t=ticket: self._arrive(t))
            elif kind == "cancel":
                ev.callbacks.append(lambda _e, t=ticket: self._cancel(t))
            else:
                ev.callbacks.append(self._stop)

    def _lag(self) -> None:
        lag = self._sim_now() - self.env.now
        self.lags.append(lag)
        self.metrics.lag.observe(lag)

    def _arrive(self, ticket: Ticket) -> None:
        env = self.env
        req = Request(self.num_submitted, env.now, ticket.prompt_len, ticket.output_len)
        self.num_submitted += 1
        ticket.req = req
        ticket.arrival = env.now
        self._lag()
        self._tickets[req.id] = ticket
        self._submit(req)

    def _submit(self, req: Request) -> None:
        self.model.ctx.submit(req)

    def _cancel_request(self, req: Request) -> None:
        self.model.ctx.cancel(req, CLIENT_DISCONNECTED)

    def _batch_of(self, req: Request) -> Any:
        """The policy batch that counts ``req``'s tokens (``None``: the request counts them)."""
        return self._batch

    def _cancel(self, ticket: Ticket) -> None:
        req = ticket.req
        if req is not None and req.state not in FINAL_STATES:
            self._sync_tokens(ticket, req)
            self._cancel_request(req)

    def _stop(self, _event: simpy.Event) -> None:
        self.source.closed = True
        self.model.engine.stop(SHUTDOWN)

    def _ended(self, req: Request) -> None:
        """``ctx.on_end``: ``req`` reached its final state."""
        ticket = self._tickets.pop(req.id, None)
        if ticket is None:
            return
        self._sync_tokens(ticket, req)
        ticket.first_token = math.nan if req.first_token is None else req.first_token
        ticket.finish = math.nan if req.finish is None else req.finish
        ticket.reason = req.reason
        ticket.state = req.state
        self._changed.append(ticket)
        m = self.metrics
        key = (req.state.name.lower(), req.reason or "")
        m.ended[key] = m.ended.get(key, 0) + 1
        if req.state == RequestState.FINISHED:
            m.e2e.observe(ticket.finish - ticket.arrival)
            m.success[ticket.finish_reason] = m.success.get(ticket.finish_reason, 0) + 1
        if req.first_scheduled is not None:
            m.queue.observe(req.first_scheduled - req.arrival)

    def _sync_tokens(self, ticket: Ticket, req: Request,
                     itl: dict[float, int] | None = None) -> None:
        """Bring ``ticket.tokens`` up to what ``req`` has emitted; count new tokens (their
        inter-token gaps into ``itl``, gap -> tokens, when given)."""
        if req.state == RequestState.FINISHED:
            n = req.output_len
        elif req._batch_seq >= 0 and (batch := self._batch_of(req)) is not None:
            n = batch.output_tokens(req)
        else:
            n = req.num_output_tokens
        new = n - ticket.tokens
        if new > 0:
            now = self.env.now
            if ticket.tokens == 0:
                self.prompt_tokens += req.prompt_len
                first = req.first_token if req.first_token is not None else now
                ticket.first_token = first
                self.metrics.ttft.observe(first - ticket.arrival)
                if new > 1:
                    self.metrics.itl.observe((now - first) / (new - 1), new - 1)
            elif itl is not None:  # gathered over the step: most gaps are equal
                gap = (now - ticket.last_token) / new
                itl[gap] = itl.get(gap, 0) + new
            else:
                self.metrics.itl.observe((now - ticket.last_token) / new, new)
            ticket.last_token = now
            self.generation_tokens += new
            ticket.tokens = n

    def _collect(self, policy: Policy) -> None:
        """After a step of ``policy``'s engine: its running requests that emitted tokens."""
        tickets = self._tickets
        changed = self._changed
        sync = self._sync_tokens
        itl: dict[float, int] = {}
        for req in policy.running_requests():
            ticket = tickets.get(req.id)
            if ticket is None:
                continue
            before = ticket.tokens
            sync(ticket, req, itl)
            if ticket.tokens != before:
                changed.append(ticket)
        observe = self.metrics.itl.observe
        for gap, n in itl.items():
            observe(gap, n)

    def _finish(self) -> VariantResult:
        """After the stop: let the model settle (no real-time waits) and summarise it."""
        env = self.env
        for _ in range(MAX_EVENTS_AFTER_STOP):
            if env.peek() == math.inf:
                break
            simpy.Environment.step(env)
        if self._changed:
            changed, self._changed = self._changed, []
            self.notify(changed)
        return self._result()

    def _result(self) -> VariantResult:
        return variant_result(self.cfg, self.model, self.num_submitted)
