"""Steps and runs of a token-level policy, one boundary after another, in one loop.

At every step boundary the engine asks a :class:`~orcasim.policies.common.BatchPolicy`
for its plan, times it, asks whether the batch then runs unchanged
(``decode_run``), moves the clock to the step's or run's end when nothing
else is due in SimPy's queue before it, lets the policy apply the effects and
records the steps. Without memory limits, on a lazy open-loop source,
:class:`TokenRunLoop` does the same boundary after boundary in one frame,
calling the same policy methods in the same order, and gives the boundary
back to the engine when something else is due: before the boundary (the
engine lets it happen first), or before the end of the step or run just
planned (the engine waits for it). A plan made here and not run here is
the one the engine runs next (the policy's ``ready_plan`` gives it), so the
policy decides each boundary once. The results are those of the engine's
own path, bit for bit.
"""

from __future__ import annotations

from types import MethodType
from typing import TYPE_CHECKING, Any

import simpy

from orcasim.backlog import Backlog
from orcasim.metrics.recorder import Recorder
from orcasim.plan import StepPlan
from orcasim.policies.base import TokenPolicy
from orcasim.policies.common import BatchPolicy
from orcasim.policies.grouped import GroupedQueue
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.pooled import PooledPlans
from orcasim.policies.queues import KeyedQueue
from orcasim.policies.runs import TokenRuns
from orcasim.policies.srpt import PLAIN as SRPT_PLAIN
from orcasim.policies.srpt import SRPT
from orcasim.policies.token_after import AfterRun
from orcasim.source import OpenLoopSource

if TYPE_CHECKING:
    from orcasim.engine import Engine


#: the plain step rule's methods, as defined (a policy, or a test, that replaces one of them
#: plans its own way: then the loop asks the policy)
PLAIN_RULE = (BatchPolicy.ready_plan, BatchPolicy.schedule, BatchPolicy.schedule_running,
              PooledPlans.make_plan)

#: the keyed decode entries that the boundary after a run copies in place, as defined (a
#: policy, or a test, that replaces one of them is asked for its entries)
KEPT_ENTRIES = (KeyedPolicy.decode_entries, SRPT.decode_entries)


def plain_after_run(kind: type) -> bool:
    """Whether ``kind``'s ``schedule`` is :class:`BatchPolicy`'s at a boundary right after a
    run: it is that one, or the class that defines it says so (``plain_after_run = True``
    in its own body: what it adds has nothing to do there)."""
    if kind.schedule is PLAIN_RULE[1]:  # type: ignore[attr-defined]
        return True
    for c in kind.__mro__:
        if "schedule" in c.__dict__:
            return bool(c.__dict__.get("plain_after_run", False))
    return False


class TokenRunLoop(AfterRun):
    """Boundaries of a token-level policy without memory limits, in one frame (see the
    module)."""

    #: off: the engine takes every boundary itself
    enabled = True
    #: off: every step that is not a run completes through the policy's ``complete_step``
    inline_steps = True
    #: off: the boundary after a run asks a keyed policy for its decode entries
    lean_entries = True
    #: off: every arrival ends a run of a preemptive policy with a full batch (on: a policy's
    #: ``arrival_floor`` lets a run go past the arrivals that cannot preempt)
    past_arrivals = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.env = engine.env
        self.ctx = engine.ctx
        self.policy: Any = engine.policy
        #: a plan this loop made and handed back: the engine's next plan
        self.plan: StepPlan | None = None
        self._own_ready = self.policy.ready_plan
        self.policy.ready_plan = self.ready_plan
        #: the policy's plan right after a run, made here (see _after_run), or None
        self._fused = self._after_run if self._plain_rule(self.policy) else None
        #: the backlog when the policy admits from it by :func:`admit_from_backlog` with
        #: nothing to call per admission (then _after_run admits its new rows inline), or None
        policy, waiting = self.policy, self.ctx.waiting
        kind = type(policy)
        self._lean: Backlog | None = waiting if (
            type(waiting) is Backlog and policy.mem is None and not policy.preemptive
            and policy.lean_backlog and kind.admitted is BatchPolicy.admitted
            and getattr(policy.admit_waiting, "__func__", None) is BatchPolicy.admit_waiting
        ) else None
        #: whether the policy's ``planned`` hook does something (else _after_run skips it);
        #: asked of the bound method (reading the policy's __dict__ would make every later
        #: attribute of the policy slower to read)
        self._hook = getattr(self.policy.planned, "__func__", None) is not BatchPolicy.planned
        #: whether a step with none of the decode pool's members (as the plan's ``_pooled``
        #: note says: a prompt-only step of ``prefill-first``, a step of newcomers) goes to
        #: ``TokenPolicy.complete_step`` directly: there is no pool to clear (see advance)
        self._inline_step = self.inline_steps and kind.complete_step is BatchPolicy.complete_step
        self._kept = 0
        if (self.lean_entries and isinstance(policy, KeyedPolicy)
                and kind.order_running is BatchPolicy.order_running):
            if kind.decode_entries is KEPT_ENTRIES[0]:
                self._kept = int(kind.order is KeyedPolicy.order)
            elif kind.decode_entries is KEPT_ENTRIES[1]:  # (as its _kept_entries)
                self._kept = 2 * (policy._exact and kind.order is SRPT_PLAIN[0]
                                  and KeyedPolicy.decode_entries is SRPT_PLAIN[1])
        #: by batch size: whether a run's plan may be charged by its aggregates (see advance)
        self._by_size: dict[int, bool] = {}
        #: by batch size: a decode step's ``(a, c)`` (``a + c * kv``, ``a > 0``), or ``()``
        #: for a model that times it otherwise (then ``Engine._run_ends``)
        self._linear: dict[int, tuple[float, float] | tuple[()]] = {}

    @classmethod
    def applies(cls, engine: Engine) -> bool:
        """Whether ``engine`` may take its boundaries through this loop: a
        :class:`~orcasim.policies.common.BatchPolicy` with runs, a plan without a generator
        and no memory limit or processes, fed by a lazy open-loop source, with fast paths
        on, no step trace, no lockstep group, in a plain SimPy environment."""
        policy: Any = engine.policy
        ctx = engine.ctx
        return (cls.enabled and engine.fast_paths and isinstance(policy, BatchPolicy)
                and policy.mem is None and policy._runs and not policy.event_driven
                and policy.ready_plan is not None and policy.decode_run is not None
                and not ctx.recorder.trace_steps and engine.group is None
                and type(engine.env) is simpy.Environment
                and type(ctx.source) is OpenLoopSource and ctx.source.lazy)

    @staticmethod
    def _plain_rule(policy: Any) -> bool:
        """Whether ``policy`` plans a step by the plain step rule of
        :class:`~orcasim.policies.common.BatchPolicy` (its schedule, running requests' tokens
        and plan), which :meth:`_after_run` follows."""
        kind = type(policy)
        return (kind.ready_plan is PLAIN_RULE[0] and plain_after_run(kind)
                and kind.schedule_running is PLAIN_RULE[2] and kind.make_plan is PLAIN_RULE[3]
                and policy.pool is not None)

    def _past(self, j: int, t: float, floor: Any) -> tuple[int, float]:
        """The arrivals from workload index ``j`` by ``t`` that cannot preempt (a true output
        length of at least ``floor``) passed: the first index not passed and the time at which
        a run ends for it (``t`` or before: it arrived by then and may preempt)."""
        src: Any = self.ctx.source
        arrival, output, n = src._arrival, src._output, src._n
        while j < n and arrival[j] <= t and output[j] >= floor:
            j += 1
        return j, (arrival[j] if j < n else float("inf"))

    def ready_plan(self) -> StepPlan | None:
        """The plan handed back by :meth:`advance`, else the policy's own ``ready_plan``."""
        plan = self.plan
        if plan is not None:
            self.plan = None
            return plan
        return self._own_ready()  # type: ignore[no-any-return]

    def ready(self) -> bool:
        """Whether the engine would offer runs at a boundary now (no admission gate, step-end
        listener or clients; the open-loop source), and no plan is handed back."""
        ctx = self.ctx
        return (self.plan is None and ctx.gate is None and ctx._step_end is None
                and ctx.clients is None and type(ctx.source) is OpenLoopSource)

    def advance(self, busy: float) -> tuple[float, float]:
        """Take boundaries from the clock's time while nothing else is due.

        Each boundary: the policy's plan, its step time, ``decode_run``; then,
        if nothing in SimPy's queue is due by the step's or run's end, the
        clock moves there, the policy takes the effects (``complete_run`` or
        ``complete_step``) and the recorder the steps, as in
        :meth:`Engine.run <orcasim.engine.Engine.run>`. A run's step ends
        (``Engine._run_ends`` for a linear model), its queue lengths
        (``OpenLoopSource.queued_by``) and its row (``Recorder.record_run``)
        are made here. Stops at a boundary where something is due now, where
        the policy has no plan, or where something is due before the planned
        step or run ends (that plan is handed back). Returns the start of the
        last step made (-1.0: none) and the engine's busy time.
        """
        env = self.env
        queue = env._queue
        ctx = self.ctx
        policy = self.policy
        engine = self.engine
        latency = engine.latency
        step_time = latency.step_time
        by_aggregates = latency.decode_by_aggregates
        by_size = self._by_size
        linear = self._linear
        own_ready = self._own_ready
        decode_run = policy.decode_run
        complete_run = policy.complete_run
        complete_step = policy.complete_step
        run_ends = engine._run_ends
        src: Any = ctx.source
        arrival, n, queued_by = src._arrival, src._n, src.queued_by
        waiting = ctx.waiting
        #: how the queue's length is read: 1 a keyed queue's, 2 a backlog's, 3 a grouped
        #: queue's (their __len__, inline), 0 by len()
        count = (1 if type(waiting) is KeyedQueue else 2 if type(waiting) is Backlog
                 else 3 if type(waiting) is GroupedQueue else 0)
        rec = ctx.recorder
        plain = "record_run" not in rec.__dict__ and type(rec).record_run is Recorder.record_run
        record_run = rec.record_run
        record_step = rec.record_step
        plain_step = ("record_step" not in rec.__dict__
                      and type(rec).record_step is Recorder.record_step)
        inline_step = self._inline_step
        token_complete = MethodType(TokenPolicy.complete_step, policy)
        t1_col, waiting_col, buf_cap = rec._t1, rec._waiting, rec._buf_cap
        r_start, r_len, r_seqs, r_tokens, r_tokens_rest, r_count, r_count_rest = rec._r_appends
        inf = float("inf")
        kind = type(policy)
        #: every arrival may preempt (TokenRuns.arrival_may_preempt: without asking)
        any_arrival = kind.arrival_may_preempt is TokenRuns.arrival_may_preempt
        plain_run = (kind.decode_run is TokenRuns.decode_run and kind.has_room is TokenRuns.has_room
                     and kind.steps_left is PooledPlans.steps_left)
        slots = ctx.slots
        #: the policy's least arrival key that may preempt (see SRPT.arrival_floor), or None
        floor_of = (getattr(policy, "arrival_floor", None) if self.past_arrivals
                    and kind.decode_run is TokenRuns.decode_run else None)
        t0 = -1.0
        fused = self._fused
        while not queue or queue[0][0] > env._now:
            plan = fused() if fused is not None else None
            if plan is None:
                plan = own_ready()
                if plan is None:
                    break
            dt = step_time(plan)
            if plan.num_seqs == 0 or not dt > 0.0:
                self.plan = plan  # (the engine counts it, or reports the step time)
                break
            dt += plan.swap_time
            now = env._now
            if count == 1:  # (KeyedQueue.__len__)
                num_waiting = len(waiting._live) + waiting._lazy
            elif count == 2:  # (Backlog.__len__)
                num_waiting = len(waiting._head) + waiting._hi - waiting._lo
            elif count:  # (GroupedQueue.__len__)
                num_waiting = waiting._n
            else:
                num_waiting = len(waiting)
            if plain_run and policy._left[0] is plan and policy._run_offer:
                # (TokenRuns.decode_run, with has_room and the steps left make_plan noted)
                run = None
                size = len(policy.running)  # (a list the policy may replace)
                if plan.num_seqs == size:
                    room = slots.count < slots.capacity
                    preemptive = policy.preemptive
                    tokens = plan.num_prefill_tokens + plan.num_decode_tokens  # (num_tokens)
                    if not ((room or (preemptive and tokens >= policy._run_budget))
                            and waiting):
                        left = policy._left[1]
                        if left:
                            run = (size, plan.num_kv_tokens + tokens, left,
                                   room or (preemptive and (any_arrival
                                                            or policy.arrival_may_preempt())))
            else:
                run = decode_run(plan)
            if run is not None and plan.scheduled is not None and not by_aggregates:
                size = run[0]
                ok = by_size.get(size)
                if ok is None:
                    ok = by_size[size] = latency.decode_coefficients(size) is not None
                if not ok:
                    run = None  # the model may read the listed requests: step by step
            if run is not None:
                if len(run) > 4:  # chained runs: the engine's way
                    self.plan = plan
                    break
                # the run's step ends (Engine._run_ends)
                size, kv, max_steps, room = run
                t1 = now + dt
                run_busy = busy + dt
                ends = [t1]
                if max_steps > 1:
                    j = src._next
                    limit = arrival[j] if room and j < n else inf
                    floor = None
                    if (t1 >= limit and floor_of is not None
                            and slots.count >= slots.capacity):  # (else: an arrival joins)
                        floor = floor_of()  # (arrivals below it may preempt: the run ends)
                        if floor is not None:
                            j, limit = self._past(j, t1, floor)
                    if t1 < limit:
                        coef = linear.get(size)
                        if coef is None:
                            c = latency.decode_coefficients(size)
                            coef = linear[size] = c if c is not None and c[0] > 0.0 else ()
                        if coef:
                            a, c = coef
                            append = ends.append
                            if limit == inf:  # every step up to the first finish
                                for x in range(kv, kv + size * (max_steps - 1), size):
                                    d = a + c * x
                                    t1 += d
                                    run_busy += d
                                    append(t1)
                            else:
                                for x in range(kv, kv + size * (max_steps - 1), size):
                                    d = a + c * x
                                    t1 += d
                                    run_busy += d
                                    append(t1)
                                    if t1 >= limit:
                                        if (floor_of is None
                                                or slots.count < slots.capacity):
                                            break
                                        if floor is None:
                                            floor = floor_of()
                                            if floor is None:
                                                break
                                        j, limit = self._past(j, t1, floor)
                                        if t1 >= limit:
                                            break
                        else:
                            ends, run_busy = run_ends(now, dt, busy, run)
                            t1 = ends[-1]
                if queue and queue[0][0] <= t1:  # something else is due first: the engine
                    self.plan = plan  # waits for the run's end
                    break
                steps = len(ends)
                j = src._next  # the queue's length at each step's start (queued_by)
                if steps > 1 and j < n and arrival[j] <= ends[-2]:
                    waits = queued_by(num_waiting, ends)
                else:  # (nobody arrives before the last step starts)
                    waits = [num_waiting] * steps
                ctx.busy_until = t1
                env._now = t1
                complete_run(plan, ends)
                ctx.last_step_end = t1
                if plain:  # (Recorder.record_run)
                    t1_col.fromlist(ends)
                    waiting_col.fromlist(waits)
                    r_start(now)
                    r_len(steps)
                    r_seqs(plan.num_seqs)
                    r_tokens(plan.num_prefill_tokens + plan.num_decode_tokens)
                    r_tokens_rest(size)
                    r_count(plan.num_itl_tokens)
                    r_count_rest(size)
                    if len(t1_col) >= buf_cap:
                        rec._flush()
                else:
                    record_run(now, ends, plan.num_seqs, (plan.num_tokens, size), waits,
                               (plan.num_itl_tokens, size))
                busy = run_busy
            else:
                t1 = now + dt
                if queue and queue[0][0] <= t1:
                    self.plan = plan
                    break
                ctx.busy_until = t1
                env._now = t1
                busy += dt
                pooled = policy._pooled
                if inline_step and pooled[0] is plan and not pooled[1]:
                    # (BatchPolicy.complete_step: no member of the pool among its requests)
                    token_complete(plan, now, t1)
                else:
                    complete_step(plan, now, t1)
                ctx.last_step_end = t1
                if plain_step:  # (Recorder.record_step)
                    tokens = plan.num_prefill_tokens + plan.num_decode_tokens  # (num_tokens)
                    bulk = plan.num_itl_tokens
                    t1_col.append(t1)
                    waiting_col.append(num_waiting)
                    r_start(now)
                    r_len(1)
                    r_seqs(plan.num_seqs)
                    r_tokens(tokens)
                    r_tokens_rest(tokens)
                    r_count(bulk)
                    r_count_rest(bulk)
                    if len(t1_col) >= buf_cap:
                        rec._flush()
                else:
                    record_step(now, t1, plan.num_seqs, plan.num_tokens, num_waiting,
                                plan.num_itl_tokens)
            engine.busy_time = busy
            t0 = now
        return t0, busy
