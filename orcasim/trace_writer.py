"""The trace writer of a step-clock run: one line in the vLLM harness's schema per schedule call.

:class:`TraceWriter` observes a ``vllm-v1`` policy (see
:mod:`orcasim.steptrace`, which runs workloads with it) and counts what the
run's summary line needs as it goes.
"""

from __future__ import annotations

import bisect
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from orcasim.policies.vllm_v1 import KIND_NAMES, KIND_RUNNING, StepOutput, VllmV1
from orcasim.request import Request

if TYPE_CHECKING:
    from orcasim.steptrace import StepWorkload


class TraceWriter:
    """Observer of a ``vllm-v1`` policy that builds one harness trace line per schedule call.

    A line is complete when the step's output has been processed (its
    ``finished`` and ``free_blocks_after_update``); lines complete in step order.
    """

    def __init__(self, block_tables: bool = False) -> None:
        self.block_tables = block_tables
        self.lines: list[dict[str, Any]] = []
        self._open: deque[dict[str, Any]] = deque()  # lines awaiting their output, oldest first
        # labels of the requests in the system, by request (each made once, at arrival)
        self._labels: dict[Request, str] = {}
        self._label = self._labels.__getitem__
        # the running list and the queue at the last call and their labels: from one step
        # to the next they mostly stay the same, and comparing them is cheaper than labelling
        self._running: list[Request] = []  # (requests compare by identity)
        self._running_labels: list[str] = []
        self._waiting: list[Request] = []
        self._waiting_labels: list[str] = []
        # what the summary counts, kept as the lines are made (see summary)
        self.requests: list[Request] = []  # every arrival, in arrival order
        self.num_empty = 0  # lines that scheduled no tokens
        self.num_preemptions = 0
        self.finish_step: dict[str, int] = {}  # in the order the lines finish them

    def scheduled(self, policy: VllmV1, out: StepOutput) -> None:
        kv = policy.kv
        labels = self._labels
        label = self._label
        arrivals = []
        if out.arrivals:
            arrivals = [r.label for r in out.arrivals]
            labels.update(zip(out.arrivals, arrivals, strict=True))
            self.requests += out.arrivals
        if not out.num_tokens:
            self.num_empty += 1
        # the harness's entry fields, in its order (an admission also gives its cached tokens)
        entries = [{"id": label(req), "n": n, "start": start, "kind": "running", "emits": emits}
                   if kind == KIND_RUNNING else
                   {"id": label(req), "n": n, "start": start, "kind": KIND_NAMES[kind],
                    "emits": emits, "cached": start}
                   for req, n, start, kind, emits in out.entries]
        if self.block_tables:
            for e, entry in zip(entries, out.entries, strict=True):
                e["blocks"] = kv.block_ids(entry[0])
        preempted = out.preempted
        if preempted:
            self.num_preemptions += len(preempted)
        running = policy.running
        if running != self._running:
            self._running = running[:]
            self._running_labels = list(map(label, running))
        waiting = policy.ctx.waiting
        if waiting or self._waiting:
            waiting = list(waiting)
            if waiting != self._waiting:
                self._waiting = waiting
                self._waiting_labels = list(map(label, waiting))
        line = {
            "step": round(policy.ctx.env._now),
            "arrivals": arrivals,
            "scheduled": entries,
            "num_batched_tokens": out.num_tokens,
            "preempted": sorted(map(label, preempted)) if preempted else [],
            "running": self._running_labels[:],
            "waiting": self._waiting_labels[:],
            "free_blocks_after_schedule": kv.pool.free_queue.num_free_blocks,
            "cached_blocks": len(kv.pool.cached),
            "finished": None,  # (set by updated: made here, the dict is made at its size)
            "free_blocks_after_update": None,
        }
        self._open.append(line)
        self.lines.append(line)

    def updated(self, policy: VllmV1, out: StepOutput, finished: list[Request]) -> None:
        line = self._open.popleft()  # outputs come in step order
        if finished:
            done = line["finished"] = list(map(self._labels.pop, finished))
            self.finish_step.update(dict.fromkeys(done, line["step"]))
        else:
            line["finished"] = []
        line["free_blocks_after_update"] = policy.kv.pool.free_queue.num_free_blocks

    def summary(self, workload: StepWorkload, wall_s: float) -> dict[str, Any]:
        """:func:`summarize_trace` of the lines, from what the writer counted as it made them.

        A request's first token comes at the end of the step whose line first
        has it emit (a step of the step clock lasts one time unit, and outputs
        are processed in step order), so its first-token step is that time less
        one; requests are ordered as the lines first have them emit (step, then
        the line's entry order), as the harness's summary is. Only those
        entries are looked at, not every line's.
        """
        lines = self.lines
        firsts = []
        for req in self.requests:
            if req.first_token is None:
                continue
            step = round(req.first_token) - 1
            label = req.label
            line = lines[bisect.bisect_left(lines, step, key=_step)]
            pos = next(i for i, e in enumerate(line["scheduled"]) if e["id"] == label)
            firsts.append((step, pos, label))
        firsts.sort()
        num_steps = len(lines) - self.num_empty  # lines that scheduled tokens
        return {
            "simulator": "orcasim",
            "config": workload.config,
            "num_requests": len(workload.requests),
            "last_step": lines[-1]["step"] if lines else -1,
            "num_engine_steps": num_steps,
            "num_preemptions": self.num_preemptions,
            "finish_step": dict(self.finish_step),
            "first_token_step": {label: step for step, _, label in firsts},
            "loop_wall_s": round(wall_s, 3),
            "ms_per_step": round(1000 * wall_s / max(1, num_steps), 4),
        }


_step = itemgetter("step")
