"""Data-parallel engines that step together: vLLM's DP group of a mixture-of-experts model.

vLLM 0.19 runs each data-parallel rank of an MoE model as a
``DPEngineCoreProc`` (``vllm/v1/engine/core.py``; dense models' ranks are
plain engines, "completely independent, so treat like DP=1",
``EngineCoreProc.run_engine_core``). Three things tie the ranks' steps
together:

- **every forward pass is collective**: before it, the ranks all-reduce
  their token counts (``coordinate_batch_across_dp``,
  ``vllm/v1/worker/dp_utils.py``, called from
  ``GPUModelRunner._determine_batch_execution_and_padding``), and every MoE
  layer all-gathers the ranks' tokens before the experts and
  reduce-scatters after them (``AgRsAll2AllManager``, the default
  ``allgather_reducescatter`` backend,
  ``vllm/distributed/device_communicators/all2all.py``). A rank's step
  therefore starts when the last rank starts its own and ends with the
  slowest;
- **DP padding**: when every rank's step runs a CUDA graph (the token count
  is at most the largest capture size on every rank: the ranks' CUDA-graph
  modes are all-reduced with ``min``, and padding applies when that is not
  ``NONE``), every rank pads its tokens to the largest padded count of the
  group (``_post_process_dp_padding``). A rank past the capture sizes turns
  padding off for the whole step and each rank computes its own count;
- **dummy batches**: ``DPEngineCoreProc.run_busy_loop`` runs
  ``execute_dummy_batch`` (a one-token forward pass, padded like the
  others) whenever the engine has nothing to schedule while the group is
  running, and the group keeps running while any rank has unfinished
  requests. Whether any has is all-reduced only every
  :data:`FINISH_SYNC_STEPS` steps (``_has_global_unfinished_reqs``), so
  the engines go on with dummy steps until the next such step after the
  last request ends; a request reaching an idle group starts a new wave
  at once.

:class:`LockstepGroup` models this with one SimPy barrier per step: each
member engine's process arrives with its plan (:meth:`LockstepGroup.step`)
or goes idle on its policy's event (:meth:`LockstepGroup.idle`); once no
member is still deciding (checked at the engines' settle priority, after
every ordinary event of the instant), the step starts for all of them and
lasts the longest member's time, the idle members counted as dummy steps.
A member arriving while a step runs waits for its end, as a vLLM rank in
a dummy step takes new requests only after it. Step times come from each
member's latency model with the group's token counts
(:meth:`~orcasim.latency.base.LatencyModel.lockstep_time`): the padded
count for the dense and MoE operators, the MoE block at the members' mean
tokens (each GPU's experts see every engine's tokens), the expert-parallel
gathers at the largest. While every member is idle and the group still
runs, its dummy steps need no events: the group works out, when something
happens, which dummy step is in flight and when the group stopped.

What is not modelled: the time a rank waits inside a step for a slower
rank at each MoE layer is counted as one wait for the slowest rank's
whole step (the layers are alike, so the same rank is slowest in each);
the coordination all-reduce's own time, and vLLM's wake-up message to
idle ranks (``START_DP_WAVE``), are taken as instantaneous.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from orcasim.engine import Engine, Until, settle
from orcasim.errors import SimulationError
from orcasim.latency.base import LatencyModel
from orcasim.plan import StepPlan

#: steps between vLLM's all-reduces of "any rank has unfinished requests"
#: (``DPEngineCoreProc._has_global_unfinished_reqs``: ``step_counter % 32``)
FINISH_SYNC_STEPS = 32
#: the token count of vLLM's dummy batch (``execute_dummy_batch`` -> ``_dummy_run(1)``)
DUMMY_TOKENS = 1

DECIDING, READY, IDLE, DONE = range(4)


class _Member:
    __slots__ = ("dummy_steps", "engine", "index", "own", "plan", "state", "steps")

    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        self.state = DECIDING  # every engine decides its first step at time 0
        self.plan: StepPlan | None = None
        self.own = 0.0  # the plan's time alone, swap included
        self.steps = 0  # steps with a batch of its own
        self.dummy_steps = 0  # dummy steps it ran while another member stepped


class LockstepGroup:
    """Engines that start every step together and step as long as the slowest of them."""

    def __init__(self, env: simpy.Environment, engines: list[Engine],
                 sync_steps: int = FINISH_SYNC_STEPS) -> None:
        self.env = env
        self.members = [_Member(k, e) for k, e in enumerate(engines)]
        self._by_engine = {id(e): m for e, m in zip(engines, self.members, strict=True)}
        self.sync_steps = sync_steps
        self.running = False  # vLLM's engines_running: the group steps, dummy or not
        self.counter = 0  # steps in the current wave (vLLM's step_counter)
        self.step_end: float | None = None  # end of the step in flight
        #: every member idle while the group runs: (start, dummy step time, counter at start,
        #: whether any member had unfinished requests)
        self._dummy: tuple[float, float, int, bool] | None = None
        self._release = simpy.Event(env)  # succeeds with the step's time when it starts
        self._checking = False
        self._sync_due = False  # a step ended whose count is a multiple of sync_steps
        self._dummy_time: float | None = None
        #: steps the group ran: real (some member had a batch) and all-dummy ones
        self.num_steps = 0
        self.num_dummy_only_steps = 0
        for m in self.members:
            engine = m.engine
            engine.group = self
            engine.process.callbacks.append(lambda _ev, m=m: self._done(m))

    # -- the engines' side ----------------------------------------------------------------

    def step(self, engine: Engine, plan: StepPlan,
             own: float) -> Generator[simpy.Event, Any, float]:
        """Wait at the barrier with ``plan`` (``own``: its time alone, swap included);
        return the group's step time once the step starts."""
        m = self._by_engine[id(engine)]
        m.state = READY
        m.plan = plan
        m.own = own
        self._want_check()
        dt = yield self._release
        return dt  # type: ignore[no-any-return]

    def idle(self, engine: Engine, ev: simpy.Event) -> None:
        """``engine`` has nothing to run and waits on ``ev``: a dummy member until it fires."""
        m = self._by_engine[id(engine)]
        m.state = IDLE
        m.plan = None
        ev.callbacks.append(lambda _ev, m=m: self._woken(m))  # type: ignore[union-attr]
        self._want_check()

    # -- the barrier ----------------------------------------------------------------------

    def _woken(self, m: _Member) -> None:
        if m.state == IDLE:
            m.state = DECIDING

    def _done(self, m: _Member) -> None:
        m.state = DONE
        m.plan = None
        self._want_check()

    def _want_check(self) -> None:
        """Check the barrier after every ordinary event of this instant (once)."""
        if not self._checking:
            self._checking = True
            settle(self.env).callbacks.append(self._check)  # type: ignore[union-attr]

    def _check(self, _ev: simpy.Event | None = None) -> None:
        self._checking = False
        if self.step_end is not None:
            return  # a step runs: its end checks again
        members = self.members
        if any(m.state == DECIDING for m in members):
            return  # the last one to decide checks again
        now = self.env.now
        if self._dummy is not None:
            self._dummy_in_flight(now)
            if self.step_end is not None:
                return
        if self._sync_due:
            self._sync_due = False
            if not any(self._unfinished(m) for m in members):
                self.running = False
                self.counter = 0
        ready = [m for m in members if m.state == READY]
        if ready:
            if not self.running:  # a new wave
                self.running = True
                self.counter = 0
            self._start(now)
        elif self.running and self._dummy is None:
            unfinished = any(self._unfinished(m) for m in members)
            self._dummy = (now, self._all_dummy_time(), self.counter, unfinished)

    def _dummy_in_flight(self, now: float) -> None:
        """Every member was idle since ``start``: find the dummy step in flight at ``now``
        and make it the step in flight, or stop the group if it stopped before ``now``."""
        start, d, c0, unfinished = self._dummy  # type: ignore[misc]
        self._dummy = None
        if now <= start:
            return  # no dummy step has started yet
        n = self.sync_steps
        done = int((now - start) // d)  # dummy steps ended by now
        if not unfinished:
            last = (-c0 - 1) % n  # the dummy step after which the all-reduce stops the group
            if done > last:
                self.num_dummy_only_steps += last + 1
                self.running = False
                self.counter = 0
                return
        self.num_dummy_only_steps += done + 1
        self.counter = c0 + done
        end = start + (done + 1) * d
        self.step_end = end
        Until(self.env, end).callbacks.append(self._end)  # type: ignore[union-attr]

    def _start(self, now: float) -> None:
        """Start a step for every member: READY ones run their plans, the others dummy steps."""
        members = self.members
        plans = [m.plan if m.state == READY else None for m in members]
        dt = max(step_times([m.engine.latency for m in members], plans,
                            [m.own for m in members]))
        for m in members:
            if m.state == READY:
                m.state = DECIDING
                m.steps += 1
            else:
                m.dummy_steps += 1
            m.plan = None
        self.num_steps += 1
        release, self._release = self._release, simpy.Event(self.env)
        release.succeed(dt)
        self.step_end = now + dt  # as each engine's timeout computes its end
        end = simpy.Timeout(self.env, dt)
        end.callbacks.append(self._end)  # type: ignore[union-attr]

    def _end(self, _ev: simpy.Event) -> None:
        """The step in flight ended: count it; every ``sync_steps`` the group learns (at
        the next check, once the members have taken the step's effects) whether any
        member has unfinished requests, and stops if none has."""
        self.step_end = None
        self.counter += 1
        if self.counter % self.sync_steps == 0:
            self._sync_due = True
        self._want_check()

    @staticmethod
    def _unfinished(m: _Member) -> bool:
        """vLLM's ``has_unfinished_requests``: requests running or waiting on the engine."""
        if m.state == DONE:
            return False
        ctx = m.engine.ctx
        return bool(ctx.waiting) or any(True for _ in m.engine.policy.running_requests())

    def _all_dummy_time(self) -> float:
        if self._dummy_time is None:
            members = self.members
            self._dummy_time = max(step_times([m.engine.latency for m in members],
                                              [None] * len(members)))
        return self._dummy_time


def step_times(latencies: list[Any], plans: list[StepPlan | None],
               own: list[float] | None = None) -> list[float]:
    """Each member's step time for ``plans`` (None: a dummy step), with vLLM's DP padding,
    KV swap time included.

    A member's step computes its tokens padded to its CUDA-graph size; when
    every member's step runs a graph, all pad to the largest. The MoE block
    is read at the members' mean computed tokens, the gathers at the largest.
    ``own`` (each plan's time alone, as the engine computed it) is taken as
    is where the group's counts are the plan's own: the latency model would
    give the same.
    """
    real = [DUMMY_TOKENS if p is None else p.num_prefill_tokens + p.num_decode_tokens
            for p in plans]
    padded = [lat.graph_tokens(n) for lat, n in zip(latencies, real, strict=True)]
    counts = [t for t, _ in padded]
    if all(graph for _, graph in padded):
        top = max(counts)
        counts = [top] * len(counts)
    mean = sum(counts) / len(counts)
    top = max(counts)
    out = []
    for k, (lat, plan, tokens) in enumerate(zip(latencies, plans, counts, strict=True)):
        if plan is not None and own is not None and (
                type(lat).lockstep_time is LatencyModel.lockstep_time
                or (tokens == padded[k][0] == top and mean == tokens and real[k] > 0)):
            out.append(own[k])  # lockstep_time(plan, ...) == step_time(plan) here
            continue
        t = lat.lockstep_time(plan, tokens, mean, top)
        if not t > 0.0:
            raise SimulationError(f"latency model {lat.type_name!r} returned a step time of "
                                  f"{t!r} s; it must be > 0")
        out.append(t + plan.swap_time if plan is not None else t)
    return out
