"""The step ends of the engine's runs of decode steps, and the rows it records for them.

:class:`RunTiming` is the part of :class:`~orcasim.engine.Engine` that adds up
a run's step latencies one by one, exactly as the engine would step by step
(:meth:`RunTiming._run_ends`), extends a run with the runs a policy chains
after its finishes (:meth:`RunTiming._chain_ends`) and records a chain run by
run (:meth:`RunTiming._record_chain`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from orcasim.context import SchedulerContext
from orcasim.errors import SimulationError
from orcasim.latency.base import DecodeEnds, LatencyModel
from orcasim.metrics.recorder import Recorder
from orcasim.plan import StepPlan


class RunTiming:
    """Run timing of :class:`~orcasim.engine.Engine` (a mixin: it sets these attributes)."""

    ctx: SchedulerContext
    latency: LatencyModel
    _coef: dict[int, tuple[float, float] | None]
    _step: dict[int, Callable[[int], float] | None]
    _ends: dict[int, DecodeEnds | None]

    def _run_ends(
        self, t0: float, dt: float, busy: float, run: tuple[int, int, int, bool]
    ) -> tuple[list[float], float]:
        """The step ends of a run whose first step takes ``dt`` from ``t0``, and the busy time.

        ``run`` is the policy's :meth:`decode_run`: after the first step,
        ``size`` sequences read ``kv`` KV tokens (``size`` more each step) for
        at most ``max_steps`` steps in all; with ``room``, the run stops at
        the first step that ends at or after the next arrival, which may join.
        Each end is the previous one plus the step's latency, in the order the
        step-by-step engine adds them.
        """
        size, kv, max_steps, room = run[:4]
        t = t0 + dt
        busy += dt
        ends = [t]
        if max_steps > 1:
            limit = self.ctx.source.next_arrival() if room else None  # type: ignore[union-attr]
            if limit is None or t < limit:
                if limit is None:
                    limit = float("inf")
                append = ends.append
                coef = self._coef.get(size, ())
                if coef == ():
                    coef = self._coef[size] = self.latency.decode_coefficients(size)
                if coef is not None and coef[0] > 0.0:  # a + c * kv, c >= 0: every step > 0
                    a, c = coef
                    for _ in range(max_steps - 1):
                        d = a + c * kv
                        t += d
                        busy += d
                        append(t)
                        if t >= limit:
                            break
                        kv += size
                elif (ends_of := self._decode_ends(size)) is not None:  # the model's loop
                    t, busy = ends_of(t, busy, kv, max_steps - 1, limit, ends)
                else:  # step by step: the model's time of a decode step of this batch
                    step = self._step.get(size, ())
                    if step == ():
                        step = self._step[size] = self.latency.decode_step(size)
                    if step is None:
                        step = self._plan_step(size)
                    for _ in range(max_steps - 1):
                        d = step(kv)
                        if not d > 0.0:
                            raise SimulationError(
                                f"latency model {self.latency.type_name!r} returned a step "
                                f"time of {d!r} s; it must be > 0")
                        t += d
                        busy += d
                        append(t)
                        if t >= limit:
                            break
                        kv += size
        return ends, busy

    def _chain_ends(self, ends: list[float], busy: float,
                    chain: Iterable[tuple[int, int, int]]) -> tuple[list[tuple[int, int]], float]:
        """Extend a run's ``ends`` with the runs the policy chains after its finishes
        (``(size, kv, steps)`` each, ``kv`` the KV tokens of the first step), each step
        timed as a decode step of its batch, up to the first end at or after the next
        arrival: ``([(size, steps)] of the runs added, busy time)``."""
        limit = self.ctx.source.next_arrival()  # type: ignore[union-attr]
        if limit is None:
            limit = float("inf")
        t = ends[-1]
        added: list[tuple[int, int]] = []
        if t >= limit:
            return added, busy
        append = ends.append
        latency = self.latency
        by_aggregates = latency.decode_by_aggregates
        for size, kv, steps in chain:
            coef = self._coef.get(size, ())
            if coef == ():
                coef = self._coef[size] = latency.decode_coefficients(size)
            if coef is None and not by_aggregates:
                break  # the model may read the listed requests: the engine's way
            a = c = 0.0
            if coef is not None and coef[0] > 0.0:
                a, c = coef
                step = None
            elif (ends_of := self._decode_ends(size)) is not None:  # the model's loop
                n = len(ends)
                t, busy = ends_of(t, busy, kv, steps, limit, ends)
                added.append((size, len(ends) - n))
                if t >= limit:
                    break
                continue
            else:
                step = self._step.get(size, ())
                if step == ():
                    step = self._step[size] = latency.decode_step(size)
                if step is None:
                    step = self._plan_step(size)
            k = 0
            while k < steps:
                d = a + c * kv if step is None else step(kv)
                if not d > 0.0:
                    raise SimulationError(
                        f"latency model {latency.type_name!r} returned a step time of {d!r} "
                        "s; it must be > 0")
                t += d
                busy += d
                append(t)
                k += 1
                if t >= limit:
                    break
                kv += size
            added.append((size, k))
            if t >= limit:
                break
        return added, busy

    def _record_chain(self, t0: float, ends: list[float], waits: list[int], plan: StepPlan,
                      run: tuple[Any, ...], chained: list[tuple[int, int]]) -> None:
        """Record a run and the runs chained after it, one row each (as run by run)."""
        rec = self.ctx.recorder
        k = run[2]
        if (type(rec).record_run is Recorder.record_run and "record_run" not in rec.__dict__
                and len(rec._t1) + len(ends) < rec._buf_cap):
            # the rows of Recorder.record_run, the steps' columns at once: no run of the
            # chain fills the buffer, so none would flush it
            rec._t1.fromlist(ends)
            rec._waiting.fromlist(waits)
            start, length, seqs, tokens, tokens_rest, count, count_rest = rec._r_appends
            start(t0)
            length(k)
            seqs(plan.num_seqs)
            tokens(plan.num_tokens)
            tokens_rest(run[0])
            count(plan.num_itl_tokens)
            count_rest(run[0])
            for size, steps in chained:
                start(ends[k - 1])
                length(steps)
                seqs(size)
                tokens(size)
                tokens_rest(size)
                count(size)
                count_rest(size)
                k += steps
            return
        record_run = rec.record_run
        record_run(t0, ends[:k], plan.num_seqs, (plan.num_tokens, run[0]), waits[:k],
                   (plan.num_itl_tokens, run[0]))
        for size, steps in chained:
            record_run(ends[k - 1], ends[k:k + steps], size, (size, size), waits[k:k + steps],
                       (size, size))
            k += steps

    def _decode_ends(self, size: int) -> DecodeEnds | None:
        """The latency model's :meth:`~orcasim.latency.base.LatencyModel.decode_ends` for a
        batch of ``size`` (asked once per size)."""
        got = self._ends.get(size, ())
        if got == ():
            got = self._ends[size] = self.latency.decode_ends(size)
        return got  # type: ignore[return-value]

    def _plan_step(self, size: int) -> Callable[[int], float]:
        """The latency of a decode step of ``size`` sequences reading ``kv`` KV tokens, from
        the plan of its aggregates (for a model that offers no :meth:`decode_step`)."""
        plan = StepPlan(size, 0)
        step_time = self.latency.step_time

        def step(kv: int) -> float:
            plan.num_kv_tokens = kv
            return step_time(plan)

        return step
