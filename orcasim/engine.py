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

A hard stop (:meth:`Engine.stop`) interrupts the process, in a step or while
the policy waits: the step in flight is lost, every running and waiting
request is aborted, and the engine runs no more steps.
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from orcasim.admission.base import reject_all
from orcasim.context import SchedulerContext
from orcasim.errors import SimulationError
from orcasim.latency.base import LatencyModel
from orcasim.policies.base import Policy

MAX_EMPTY_STEPS = 1000


class Engine:
    """Runs the policy's steps, charging each by the latency model."""

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
        self.process = env.process(self.run())
        for proc in policy.processes():
            env.process(proc)

    def stop(self, reason: str) -> None:
        """Hard stop: abort what runs and waits with ``reason``; later arrivals are ``stopped``."""
        self.stopped = True
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

    def run(self) -> Generator[simpy.Event, object, None]:
        env = self.env
        ctx = self.ctx
        policy = self.policy
        step_time = self.latency.step_time
        rec = ctx.recorder
        record_step = rec.record_step
        trace = rec.trace_steps
        timeout = simpy.Timeout
        prev_end = 0.0
        empty_run = 0
        busy = 0.0
        t0 = -1.0  # start of the latest step; a step is in flight while t0 >= prev_end
        ready = policy.ready_plan
        queue = env._queue
        gen = None  # the policy's decision in progress (its next_step generator)
        ev: simpy.Event | None = None  # the event that decision waits on
        try:
            while True:
                if gen is None:
                    # let this instant's processes react first (SimPy's queue, read directly)
                    while queue and queue[0][0] <= env._now and queue[0][1] < SETTLE:
                        yield settle(env)
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
                t0 = env.now
                ctx.busy_until = t0 + dt
                num_waiting = len(ctx.waiting)
                labels = policy.batch_labels(plan) if trace else None
                yield timeout(env, dt)
                t1 = env.now
                busy += dt
                policy.complete_step(plan, t0, t1)
                ctx.last_step_end = t1
                if ctx._step_end is not None:
                    ctx.end_step(t1)
                if labels is not None:
                    rec.record_batch(t0, t1, labels)
                record_step(t0, t1, plan.num_seqs, plan.num_tokens, num_waiting, t1 - prev_end,
                            plan.num_itl_tokens)
                prev_end = t1
                self.busy_time = busy
        except simpy.Interrupt as stop:
            if t0 >= prev_end:  # the step in flight is lost, but the GPU was busy with it
                self.busy_time = busy + env.now - t0
            ctx.busy_until = env.now
            self._abort_all(str(stop.cause))


#: priority of the engine's settle events: after every ordinary event of the same instant,
#: so engines sharing one environment (a cluster) never wait on each other's settle events
SETTLE = 2


def settle(env: simpy.Environment) -> simpy.Event:
    """An event processed after every ordinary event of this instant, and those they cause."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    env.schedule(ev, SETTLE)
    return ev


def happened(ev: simpy.Event | None) -> bool:
    """True once ``ev`` has occurred: processed, or triggered and not a timeout still pending."""
    if ev is None or ev.callbacks is None:
        return True
    return ev.triggered and not isinstance(ev, simpy.Timeout)
