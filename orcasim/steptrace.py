"""Step-clock runs of the ``vllm-v1`` policy in the vLLM harness's formats.

The harness (``shared/oracle/harness.py``) drives vLLM's own V1 scheduler in
*step time*: a request is added just before the schedule() call whose index
equals its ``arrival_step``, and each schedule() call writes one JSON line.
Here the same run goes through orcasim's SimPy engine with a constant latency
of one time unit per step, so step ``k`` runs over ``[k, k + 1)``, an idle
engine jumps to the next arrival, and the ``vllm-v1`` policy (with
``empty_steps``) makes every schedule call a step. A request's
``arrival_step`` names the schedule call that first sees it, so the policy's
``input_lag`` (which maps arrival *times* to schedule calls) is off.

:func:`load_workload` reads the harness's workload JSON, :func:`run_trace`
runs it and returns the trace lines (the harness's schema: same fields, same
id orders) and a summary.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import simpy
from pydantic import Field, ValidationError

from orcasim.context import SchedulerContext
from orcasim.engine import Engine
from orcasim.errors import SimulationError, UsageError
from orcasim.latency.linear import ConstantLatency
from orcasim.metrics.recorder import Recorder
from orcasim.params import ComponentParams
from orcasim.policies.vllm_v1 import VllmV1, misfit_reason
from orcasim.source import OpenLoopSource
from orcasim.spec import format_validation_error
from orcasim.trace_writer import TraceWriter
from orcasim.workload.base import WorkloadArrays

#: the harness's config keys and defaults (``output_token``: the stub's token id, no effect)
HARNESS_CONFIG: dict[str, Any] = {
    "block_size": 16,
    "num_blocks": 1024,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
    "max_model_len": 8192,
    "output_token": 7,
    "async_scheduling": False,
}


class TraceRequest(ComponentParams):
    """One request of a harness workload."""

    id: str | int
    arrival_step: int = Field(ge=0)
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    priority: int = 0
    prefix_id: str | int | None = None
    prefix_len: int = Field(0, ge=0)


class StepWorkload:
    """A validated harness workload: the policy's parameters and the requests in arrival order."""

    def __init__(self, config: dict[str, Any], requests: list[TraceRequest]) -> None:
        self.config = config
        self.requests = requests
        self.params: VllmV1.Params = VllmV1.Params(  # type: ignore[assignment]
            **{k: v for k, v in config.items() if k != "output_token"}, empty_steps=True,
            input_lag=False)  # an arrival_step names the schedule call that sees the request
        self._arrays: tuple[list[TraceRequest], WorkloadArrays] | None = None

    def arrays(self) -> WorkloadArrays:
        """The requests as workload columns (arrival time = arrival step).

        Made once for a request list and shared by the runs of the workload (a
        run only reads them).
        """
        reqs = self.requests
        made = self._arrays
        if made is None or made[0] is not reqs:
            made = self._arrays = (reqs, self._make_arrays())
        return made[1]

    def _make_arrays(self) -> WorkloadArrays:
        reqs = self.requests
        return WorkloadArrays(
            arrival=np.array([float(r.arrival_step) for r in reqs], dtype=np.float64),
            prompt_len=np.array([r.prompt_len for r in reqs], dtype=np.int64),
            output_len=np.array([r.output_len for r in reqs], dtype=np.int64),
            attrs={
                "name": [str(r.id) for r in reqs],
                "priority": [r.priority for r in reqs],
                "prefix_id": [None if r.prefix_id is None else str(r.prefix_id) for r in reqs],
                "prefix_len": [r.prefix_len for r in reqs],
            },
        )


def parse_workload(data: Any, source: str = "workload") -> StepWorkload:
    """Validate harness workload data (a request list or ``{"config", "requests"}``).

    A mistake is a :class:`~orcasim.errors.UsageError` naming the field
    (``workload.json: requests[3].prompt_len: ...``).
    """
    config = dict(HARNESS_CONFIG)
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"config", "requests"})
        if unknown:
            raise UsageError(f"{source}: {unknown[0]}: unknown field (expected config, requests)")
        if "requests" not in data:
            raise UsageError(f"{source}: requests: required field is missing")
        cfg = data.get("config") or {}
        if not isinstance(cfg, dict):
            raise UsageError(f"{source}: config: expected an object")
        for key in cfg:
            if key not in HARNESS_CONFIG:
                raise UsageError(f"{source}: config.{key}: unknown key "
                                   f"(known: {', '.join(HARNESS_CONFIG)})")
        config.update(cfg)
        data = data["requests"]
    if not isinstance(data, list) or not data:
        raise UsageError(f"{source}: requests: expected a non-empty list of requests")
    if not isinstance(config["output_token"], int) or isinstance(config["output_token"], bool):
        raise UsageError(f"{source}: config.output_token: expected an integer")
    try:
        workload = StepWorkload(config, [])
    except ValidationError as err:
        field, msg = format_validation_error(err, "config")
        raise UsageError(f"{source}: {field}: {msg}") from None
    reqs: list[tuple[int, int, TraceRequest]] = []
    seen: set[str] = set()
    for i, raw in enumerate(data):
        where = f"requests[{i}]"
        if not isinstance(raw, dict):
            raise UsageError(f"{source}: {where}: expected an object")
        try:
            r = TraceRequest.model_validate(raw)
        except ValidationError as err:
            field, msg = format_validation_error(err, where)
            raise UsageError(f"{source}: {field}: {msg}") from None
        rid = str(r.id)
        if rid in seen:
            raise UsageError(f"{source}: {where}.id: duplicate request id {rid!r}")
        seen.add(rid)
        reason = misfit_reason(r.prompt_len, r.output_len, workload.params)
        if reason is not None:
            raise UsageError(f"{source}: {where} (id {rid!r}): can never run: {reason}")
        reqs.append((r.arrival_step, i, r))
    reqs.sort(key=lambda t: (t[0], t[1]))  # arrival step, then file order (the harness's order)
    workload.requests = [r for _, _, r in reqs]
    return workload


def load_workload(path: str | Path) -> StepWorkload:
    """Read and validate a harness workload JSON file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{source}: cannot read: {err.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{source}: line {err.lineno}: invalid JSON: {err.msg}") from None
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply") from None
    return parse_workload(data, source)



class _RowsOnly(Recorder):
    """A step trace's recorder: the requests' rows (the run checks that every request
    finished), no step columns or inter-token gaps (the trace lines say what each step
    did, and nothing reads the run's metrics)."""

    records_steps = False

    def record_step(self, t_start: float, t_end: float, num_seqs: int, num_tokens: int,
                    num_waiting: int, itl_count: int) -> None:
        return None

    def record_itl(self, gap: float, count: int = 1) -> None:
        return None


@contextmanager
def _young_collections_rarer(threshold: int = 50_000) -> Iterator[None]:
    """Collect the youngest generation every ``threshold`` allocations instead of every
    700, until the block ends (the previous thresholds are put back).

    A trace keeps every line, a dict with half a dozen lists, to the end: with
    the default threshold the cyclic collector runs every few steps and
    promotes them over and over (about 3 % of a golden workload's run). The
    run makes little cyclic garbage, and it is still collected, less often.

    At the end, what the run left in the young generations moves to the oldest
    one unscanned (a freeze and thaw, when nothing else is frozen): put back
    as it was, the youngest generation's threshold would collect the run's
    objects at the next allocation, a pass over every line it made (about 8 %
    of a golden workload's run) that frees next to nothing. Cyclic garbage
    among them is collected by the next full collection.
    """
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        if gc.get_freeze_count():  # someone else's frozen objects: leave them be
            gc.set_threshold(*before)
        else:
            gc.freeze()
            gc.set_threshold(*before)
            gc.unfreeze()


def run_trace(workload: StepWorkload, *, block_tables: bool = False
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``workload`` on the step clock: the trace lines and a summary."""
    with _young_collections_rarer():
        return _run_trace(workload, block_tables)


def _run_trace(workload: StepWorkload, block_tables: bool
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    t0 = time.perf_counter()
    env = simpy.Environment()
    rec = _RowsOnly()
    ctx = SchedulerContext(env, rec)
    policy = VllmV1(workload.params, ctx)
    assert policy.pool is not None
    policy.pool.series = rec.kv = None  # a trace has no memory series: none is kept
    policy.plans_by_sizes = True  # a constant step time and no step columns read only sizes
    writer = TraceWriter(block_tables)
    policy.observer = writer
    OpenLoopSource(env, ctx, workload.arrays())
    Engine(env, ctx, policy, ConstantLatency(ConstantLatency.Params(step_time=1.0)))
    env.run()
    wall = time.perf_counter() - t0
    lines = writer.lines
    if rec.num_recorded != len(workload.requests) or writer._open:
        raise SimulationError(f"the run ended with {len(workload.requests) - rec.num_recorded} "
                           "requests unfinished")
    return lines, writer.summary(workload, wall)


def summarize_trace(lines: list[dict[str, Any]], workload: StepWorkload,
                    wall_s: float) -> dict[str, Any]:
    """The summary line's figures, as the harness computes them from its trace (a run's
    :meth:`TraceWriter.summary` gives the same without a pass over the lines)."""
    finish_step: dict[str, int] = {}
    first_token_step: dict[str, int] = {}
    for line in lines:
        for rid in line["finished"]:
            finish_step[rid] = line["step"]
        for e in line["scheduled"]:
            if e["emits"] and e["id"] not in first_token_step:
                first_token_step[e["id"]] = line["step"]
    num_steps = sum(1 for line in lines if line["num_batched_tokens"] > 0)
    return {
        "simulator": "orcasim",
        "config": workload.config,
        "num_requests": len(workload.requests),
        "last_step": lines[-1]["step"] if lines else -1,
        "num_engine_steps": num_steps,
        "num_preemptions": sum(len(line["preempted"]) for line in lines),
        "finish_step": finish_step,
        "first_token_step": first_token_step,
        "loop_wall_s": round(wall_s, 3),
        "ms_per_step": round(1000 * wall_s / max(1, num_steps), 4),
    }


def write_trace(path: str | Path, lines: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Write trace lines and the summary line as JSONL."""
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
        f.write(json.dumps({"summary": summary}) + "\n")


def read_trace(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A JSONL step trace: its step lines and its summary (None if it has none)."""
    lines: list[dict[str, Any]] = []
    summary = None
    with open(path, encoding="utf-8") as f:
        for text in f:
            if not text.strip():
                continue
            obj = json.loads(text)
            if "summary" in obj:
                summary = obj["summary"]
            else:
                lines.append(obj)
    return lines, summary


def first_difference(ours: list[dict[str, Any]], ref: list[dict[str, Any]]) -> str | None:
    """The first field where two step traces differ (``"step 12: running = [...] want [...]"``).

    Every field of every line is compared, in the reference's field order; None
    when the traces are equal.
    """
    for got, want in zip(ours, ref, strict=False):
        if got == want:
            continue
        for key in [*want, *(k for k in got if k not in want)]:
            if got.get(key) != want.get(key):
                step = want.get("step", got.get("step"))
                return (f"step {step}: {key} = {json.dumps(got.get(key))[:200]} "
                        f"want {json.dumps(want.get(key))[:200]}")
    if len(ours) != len(ref):
        return f"{len(ours)} steps, want {len(ref)}"
    return None
