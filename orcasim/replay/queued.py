"""Where a measured TTFT starts: when vLLM's engine loop takes the request.

vLLM stamps a request's ``queued_ts`` in ``Scheduler.add_request``
(``request.record_event(EngineCoreEventType.QUEUED)``,
``vllm/v1/core/sched/scheduler.py``), which the engine core's busy loop calls
for the requests in its input queue between steps
(``EngineCoreProc.run_busy_loop``: ``_process_input_queue``, then
``_process_engine_step``, ``vllm/v1/engine/core.py``). While a step computes,
the loop is blocked on its output (``step``) or, under async scheduling, on
the output of the oldest step in flight (``step_with_batch_queue``), so a
request that arrives while a step runs is taken when that step ends, and one
that reaches an idle engine is taken at once. A data-parallel rank of an MoE
model with nothing of its own to run takes dummy steps in lockstep with the
other ranks and reads its input queue between them
(``DPEngineCoreProc.run_busy_loop``), so for a lockstep group the steps in
flight are the group's.

The measured TTFT and E2E count from that moment, not from the request's
arrival at the engine; :func:`engine_queued_times` gives the same moment in a
simulated run, from its step spans, so that the prediction is measured the
same way. The simulated ``vllm-v1`` policy takes requests at the same step
boundaries (``input_lag``), so this changes where the latencies start, not
when anything runs. Not covered: a lockstep group whose engines all take
dummy steps (until vLLM's next all-reduce of unfinished requests) has no
step in the series, so a request reaching it then counts from its arrival,
at most one dummy step early.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def engine_queued_times(arrival: np.ndarray, engine: np.ndarray, step_start: np.ndarray,
                        step_end: np.ndarray, step_engine: np.ndarray) -> np.ndarray:
    """Each request's ``queued_ts`` as vLLM stamps it, in simulated time.

    ``arrival``: each request's arrival at its engine; ``engine``: the engine
    (an integer key) it went to. ``step_start``, ``step_end``, ``step_engine``:
    every simulated step's span and engine key. Engines that step together
    (a lockstep group) share one key. A request arriving while a step of its
    engine runs (``start < arrival < end``) is taken at the end of that step;
    otherwise at its arrival. NaN arrivals stay NaN.
    """
    arrival = np.asarray(arrival, dtype=np.float64)
    engine = np.asarray(engine)
    out = arrival.copy()
    step_start = np.asarray(step_start, dtype=np.float64)
    step_end = np.asarray(step_end, dtype=np.float64)
    step_engine = np.asarray(step_engine)
    for key in np.unique(step_engine):
        own = step_engine == key
        order = np.argsort(step_start[own], kind="stable")
        starts = step_start[own][order]
        # the latest end among the steps started so far: steps of one engine follow each
        # other, and a lockstep group's members share their spans
        ends = np.maximum.accumulate(step_end[own][order])
        mine = np.flatnonzero(engine == key)
        t = arrival[mine]
        k = np.searchsorted(starts, t, side="left") - 1  # the last step started before t
        started = k >= 0
        end = np.where(started, ends[np.maximum(k, 0)], -np.inf)
        out[mine] = np.where(end > t, end, t)
    return out


def simulated_queued(columns: dict[str, Any], series: dict[str, np.ndarray], lockstep: bool
                     ) -> np.ndarray | None:
    """:func:`engine_queued_times` of a simulated run's requests, from its result columns
    (``arrival``, and ``replica`` for a cluster) and step series; ``None`` when the series
    is time-binned (it then no longer holds each step's span).

    A cluster's series numbers its replicas in the order of their names in
    ``columns["replica"]`` as the cluster builds them (``<group>-<k>``, one
    group); with ``lockstep`` they all share one key.
    """
    if "num_steps" in series and np.any(np.asarray(series["num_steps"]) > 1):
        return None
    arrival = np.asarray(columns["arrival"], dtype=np.float64)
    step_engine = np.asarray(series.get("replica", np.zeros(len(series["t_start"]))))
    names = columns.get("replica")
    if names is None:
        engine = np.zeros(len(arrival), dtype=np.int64)
    else:  # "<group>-<k>": the series' replica index is k; None: the router rejected it
        engine = np.array([-1 if n is None else int(str(n).rsplit("-", 1)[1]) for n in names],
                          dtype=np.int64)
    if lockstep:  # one engine key for the group
        engine = np.minimum(engine, 0)
        step_engine = np.zeros(len(step_engine), dtype=np.int64)
    return engine_queued_times(arrival, engine, series["t_start"], series["t_end"], step_engine)
