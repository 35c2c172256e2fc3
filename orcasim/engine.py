"""The GPU engine: a SimPy process that executes one step (iteration) at a time.

At each step boundary the engine runs the policy's decision, its
``next_step`` generator, until it returns a :class:`~orcasim.plan.StepPlan`
(``None``: no more work). The decision may wait on any SimPy event (an
arrival, a freed slot or freed memory, the end of a step, a timer). While it
waits, the engine keeps running the batch as it is
(:meth:`~orcasim.policies.base.Policy.continue_step`) and resumes the decision
at the first boundary after the event; with nothing running, the engine
waits for the event itself. The policy's event-driven processes
(:meth:`~orcasim.policies.base.Policy.processes`) run beside it and change
the batch at any time: before each decision, the engine lets every process
with something to do at that instant run (a process woken by the step's
``slot_freed`` admits in time for the next step). The engine charges each
step's latency (plus any KV swap time the plan carries) as one timeout, lets
the policy apply the step's effects, and records the step. A step is one
SimPy event whatever the batch size.

Runs of steps in which the batch cannot change (decode-only policies that
offer :meth:`~orcasim.policies.base.DecodeOnlyPolicy.decode_run`, and
token-level policies from a step that schedules every running request for
all its missing tokens, after which each decodes one token a step
(:meth:`~orcasim.policies.base.TokenPolicy.decode_run`): nobody finishes
before the run's last step, and no arrival could join before it)
are charged as one timeout: the engine adds up the steps' latencies one by
one, exactly as it would step by step, and the policy and the recorder take
the whole run at its end. For the same policies, the source releases
arrivals into a backlog at step boundaries and wakes on its own only for an
idle policy (:meth:`~orcasim.source.OpenLoopSource.release_lazily`). The
results are those of per-step simulation, bit for bit
(``Engine.fast_paths = False`` turns both off). A policy may chain the runs
that follow a run's finishes (a fifth item of its ``decode_run``: the
batch after each finish, as ``(size, kv, steps)``); the engine takes them in
the same event when it moves the clock itself, up to the next arrival, and
records each as a run of its own.

With the fast paths, the engine also skips the wait for a step or a run
when SimPy's queue holds nothing before its end: SimPy's next event would be
that end, so the engine moves the clock there itself and goes on (never in
a real-time environment, whose clock follows the wall's). Anything
scheduled earlier (an arrival the source waits for, a timer, another
engine's step, a hard stop) makes it wait as usual, so every process sees
the same clock and state as step by step.

For ``continuous`` without memory limits on such a source, the engine
hands each boundary to :class:`~orcasim.policies.decode_loop.FcfsDecodeLoop`
(with a paged memory limit, :class:`~orcasim.policies.kv_loop.KVDecodeLoop`),
which takes run after run in one frame (admissions, the run's step ends, its
finishers and its rows) while nothing else is due, and gives a boundary back
to the engine's own path when something is. A token-level policy without
memory limits hands its boundaries to
:class:`~orcasim.policies.token_loop.TokenRunLoop` the same way.

A hard stop (:meth:`Engine.stop`) interrupts the process, in a step or while
the policy waits: the step in flight is lost, every running and waiting
request is aborted, and the engine runs no more steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

import simpy

from orcasim.admission.base import reject_all
from orcasim.context import SchedulerContext
from orcasim.errors import SimulationError
from orcasim.latency.base import DecodeEnds, LatencyModel
from orcasim.plan import StepPlan
from orcasim.policies.base import Policy
from orcasim.policies.decode_loop import FcfsDecodeLoop
from orcasim.policies.kv_loop import KVDecodeLoop
from orcasim.policies.token_loop import TokenRunLoop
from orcasim.run_timing import RunTiming
from orcasim.sim_events import SETTLE, Until, happened, settle
from orcasim.source import OpenLoopSource

MAX_EMPTY_STEPS = 1000


class Engine(RunTiming):
    """Runs the policy's steps, charging each by the latency model."""

    #: advance runs of unchanged-batch steps in one event, and let the source release
    #: arrivals lazily where that changes nothing (off: one event per step and per arrival)
    fast_paths: bool = True
    #: the data-parallel group this engine steps together with (orcasim.cluster.lockstep)
    group = None

    def __init__(
        self,
        env: simpy.Environment,
        ctx: SchedulerContext,
        policy: Policy,
        latency: LatencyModel,
    ) -> None:
        self.env = env
        self.ctx = ctx
        self.policy = policy
        self.latency = latency
        self.busy_time = 0.0
        self.stopped = False
        #: the event the engine waits on with the policy, while nothing runs (for stall reports)
        self.waiting_on: simpy.Event | None = None
        #: the run in flight: (first plan, its latency, busy time before, decode_run, ends)
        self._run: tuple | None = None
        #: the latency model's decode coefficients and step functions by batch size (it gives
        #: the same each time)
        self._coef: dict[int, tuple[float, float] | None] = {}
        self._step: dict[int, Callable[[int], float] | None] = {}
        self._ends: dict[int, DecodeEnds | None] = {}  # the latency model's decode_ends
        if hasattr(policy, "plans_by_aggregates"):  # all-decode plans may leave out the list
            policy.plans_by_aggregates = latency.decode_by_aggregates
            if hasattr(policy, "prefill_plans_by_aggregates"):  # and those with one prompt
                policy.prefill_plans_by_aggregates = latency.prefill_by_aggregates
        if (self.fast_paths and policy._runs and not policy.event_driven
                and self._runs_allowed() and not ctx.waiting
                and (type(ctx.waiting) is deque or getattr(ctx.waiting, "takes_releases", False))):
            ctx.source.release_lazily()  # type: ignore[union-attr]
        #: whole runs of a first-come-first-served decode batch in one loop, where it applies
        self._loop: FcfsDecodeLoop | KVDecodeLoop | TokenRunLoop | None = (
            FcfsDecodeLoop(self) if FcfsDecodeLoop.applies(self)
            else KVDecodeLoop(self) if KVDecodeLoop.applies(self)
            else TokenRunLoop(self) if TokenRunLoop.applies(self) else None)
        self.process = env.process(self.run())
        for proc in policy.processes():
            env.process(proc)

    def stop(self, reason: str) -> None:
        """Hard stop: abort what runs and waits with ``reason``; later arrivals are ``stopped``."""
        self.stopped = True
        src = self.ctx.source
        if src is not None and src.lazy:  # what arrived is queued (and aborted); later
            src.flush(self.env.now)  # arrivals are rejected as they come
            src.release_eagerly()
        self.ctx.gate = reject_all("stopped")
        if self.process.is_alive:
            self.process.interrupt(reason)
        else:
            self._abort_all(reason)

    def _abort_all(self, reason: str) -> None:
        ctx = self.ctx
        policy = self.policy
        for req in list(policy.running_requests()):
            policy.drop(req)
            ctx.abort(req, reason)
        for req in list(ctx.waiting):
            ctx.abort(req, reason)
        ctx.waiting.clear()

    def _runs_allowed(self) -> bool:
        """Whether nothing but the clock's arrivals can change the batch during a run.

        Admission gates, clients that give up, step-end listeners and sources
        other than the plain open-loop one could act between steps, so their
        presence keeps the engine stepping one event at a time.
        """
        ctx = self.ctx
        return (ctx.gate is None and ctx.clients is None and ctx._step_end is None
                and type(ctx.source) is OpenLoopSource)

    def _cut_run(self, t0: float) -> tuple[float, float]:
        """The run in flight was interrupted: apply and record its steps that ended by now.

        Returns the start of the step in flight and the busy time before it,
        both as the step-by-step engine would have them.
        """
        plan, dt, busy, run, ends, waits = self._run  # type: ignore[misc]
        now = self.env.now
        done = [t for t in ends if t <= now]
        if not done:
            return t0, busy
        _, busy = self._run_ends(t0, dt, busy, (run[0], run[1], len(done), False))
        self._record_run(plan, t0, done, waits[:len(done)], run[0])
        return done[-1], busy

    def _record_run(self, plan: StepPlan, t0: float, ends: list[float], waits: list[int],
                    size: int) -> None:
        """The policy takes the run's effects, then the recorder its steps."""
        ctx = self.ctx
        self.policy.complete_run(plan, ends)  # type: ignore[attr-defined]
        ctx.last_step_end = ends[-1]
        ctx.recorder.record_run(t0, ends, plan.num_seqs, (plan.num_tokens, size), waits,
                                (plan.num_itl_tokens, size))

    def run(self) -> Generator[simpy.Event, object, None]:
        env = self.env
        ctx = self.ctx
        policy = self.policy
        step_time = self.latency.step_time
        rec = ctx.recorder
        record_step = rec.record_step if rec.records_steps else None
        trace = rec.trace_steps
        timeout = simpy.Timeout
        prev_end = 0.0
        empty_run = 0
        busy = 0.0
        t0 = -1.0  # start of the latest step; a step is in flight while t0 >= prev_end
        ready = policy.ready_plan
        group = self.group  # lockstep: each step waits for the group's, no runs or skips
        runs = getattr(policy, "decode_run", None) if (self.fast_paths and not trace
                                                       and group is None) else None
        complete_run = getattr(policy, "complete_run", None)
        record_run = rec.record_run
        queue = env._queue
        # with nothing else in SimPy's queue before the end of a step or run, waiting for it
        # is moving the clock there: the engine does that itself (not in real time, where the
        # clock follows the wall's, and not with fast paths off)
        skip = self.fast_paths and type(env) is simpy.Environment and group is None
        loop = self._loop if runs is not None and skip else None
        gen = None  # the policy's decision in progress (its next_step generator)
        ev: simpy.Event | None = None  # the event that decision waits on
        try:
            while True:
                if gen is None:
                    # let this instant's processes react first (SimPy's queue, read directly)
                    while queue and queue[0][0] <= env._now and queue[0][1] < SETTLE:
                        yield settle(env)
                    if loop is not None and (not queue or queue[0][0] > env._now) and loop.ready():
                        start, busy = loop.advance(busy)  # runs while nothing else is due
                        if start >= 0.0:
                            t0, prev_end, empty_run = start, env._now, 0
                    plan = ready() if ready is not None else None
                    if plan is None:
                        gen = policy.next_step()
                        try:
                            ev = gen.send(None)
                        except StopIteration as done:
                            plan, gen = done.value, None
                else:  # the decision waits on ev: resume it if ev has happened by now
                    while (not happened(ev) and queue and queue[0][0] <= env._now
                           and queue[0][1] < SETTLE):
                        yield settle(env)  # let this instant's events be processed first
                    if happened(ev):
                        try:
                            ev = gen.send(ev.value)  # type: ignore[union-attr]
                        except StopIteration as done:
                            plan, gen = done.value, None
                if gen is not None:  # still waiting: the engine runs the batch as it is
                    plan = policy.continue_step()
                    if plan is None:  # nothing runs: the engine waits with the policy
                        self.waiting_on = ev
                        if group is not None:
                            group.idle(self, ev)
                        yield ev
                        self.waiting_on = None
                        continue
                elif plan is None:
                    break
                if plan.num_seqs == 0:
                    empty_run += 1
                    if empty_run > MAX_EMPTY_STEPS:
                        raise SimulationError(
                            f"policy {policy.type_name!r} scheduled {MAX_EMPTY_STEPS} empty "
                            f"steps in a row at t={env.now:.6g}: no progress"
                        )
                else:
                    empty_run = 0
                dt = step_time(plan)
                if not dt > 0.0:
                    raise SimulationError(
                        f"latency model {self.latency.type_name!r} returned a step time of "
                        f"{dt!r} s; it must be > 0"
                    )
                dt += plan.swap_time
                if group is not None:  # the group's step, as long as its slowest member
                    dt = yield from group.step(self, plan, dt)
                t0 = env._now
                num_waiting = len(ctx.waiting)
                run = None
                src = ctx.source
                if (runs is not None and ctx.gate is None and ctx._step_end is None
                        and ctx.clients is None and type(src) is OpenLoopSource):
                    run = runs(plan)  # the conditions of _runs_allowed, inline: once per step
                    if (run is not None and plan.scheduled is not None
                            and not self.latency.decode_by_aggregates
                            and self.latency.decode_coefficients(run[0]) is None):
                        run = None  # the model may read the listed requests: step by step
                if run is not None:  # the batch runs unchanged for len(ends) steps
                    ends, run_busy = self._run_ends(t0, dt, busy, run)
                    chained = None
                    if len(run) > 4 and skip and len(ends) == run[2]:  # runs after finishes
                        chained, run_busy = self._chain_ends(ends, run_busy, run[4])
                    waits = src.queued_by(num_waiting, ends)  # type: ignore[union-attr]
                    t1 = ends[-1]
                    if chained and queue and queue[0][0] <= t1:  # something else comes first
                        del ends[run[2]:]
                        waits = waits[:run[2]]
                        _, run_busy = self._run_ends(t0, dt, busy, run)
                        chained = None
                        t1 = ends[-1]
                    ctx.busy_until = t1
                    if skip and (not queue or queue[0][0] > t1):
                        env._now = t1  # nothing else happens before t1: SimPy's next event is
                        # the run's end, so its clock goes there and the engine goes on
                    else:
                        self._run = (plan, dt, busy, run, ends, waits)
                        yield Until(env, t1)
                        self._run = None
                    complete_run(plan, ends)  # the policy takes the run, then the recorder
                    ctx.last_step_end = t1
                    if chained:
                        self._record_chain(t0, ends, waits, plan, run, chained)
                    else:
                        record_run(t0, ends, plan.num_seqs, (plan.num_tokens, run[0]), waits,
                                   (plan.num_itl_tokens, run[0]))
                    prev_end = t1
                    self.busy_time = busy = run_busy
                    continue
                ctx.busy_until = t0 + dt
                labels = policy.batch_labels(plan) if trace else None
                t1 = env._now + dt  # as SimPy schedules the timeout
                if skip and (not queue or queue[0][0] > t1):
                    env._now = t1  # nothing else happens before the step's end (as above)
                else:
                    yield timeout(env, dt)
                busy += dt
                policy.complete_step(plan, t0, t1)
                ctx.last_step_end = t1
                if ctx._step_end is not None:
                    ctx.end_step(t1)
                if labels is not None:
                    rec.record_batch(t0, t1, labels)
                if record_step is not None:
                    record_step(t0, t1, plan.num_seqs, plan.num_tokens, num_waiting,
                                plan.num_itl_tokens)
                prev_end = t1
                self.busy_time = busy
        except simpy.Interrupt as stop:
            if self._run is not None:  # in a run: the steps that ended count, the one in flight
                # is lost
                t0, busy = self._cut_run(t0)
            if t0 >= prev_end:  # the step in flight is lost, but the GPU was busy with it
                self.busy_time = busy + env.now - t0
            ctx.busy_until = env.now
            self._abort_all(str(stop.cause))
