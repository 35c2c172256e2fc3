"""``vllm-v1``: vLLM V1's scheduler (0.33.0), decision for decision.

Each step has one token budget and no prefill or decode phase: every
scheduled request's computed tokens catch up with its known tokens (prompt
plus generated) as far as the budget allows.

1. Running requests first, in running-list order. Each gets the tokens it is
   missing (capped by ``long_prefill_token_threshold`` when more than one
   request is in the system, by the budget and by ``max_model_len``). If its
   blocks do not fit, the policy preempts by recompute, retrying until they
   fit: the last running request (``fcfs``) or the running request with the
   largest ``(priority, arrival)`` (``priority``), possibly the request itself.
2. Waiting requests next, unless this step preempted: in queue order (FCFS, or
   ``(priority, arrival)``), each admitted with its prefix-cache hit; the first
   one that does not fit (blocks, ``max_num_seqs``, budget without chunked
   prefill) blocks the rest. A preempted request goes back to the head of the
   queue and starts again from zero, hitting its own cached blocks.
3. After the step, requests whose step completed all their known tokens sample
   a token; a request ends at ``output_len`` tokens or ``max_model_len``.

With ``async_scheduling`` the engine keeps two steps in flight, like vLLM's
batch queue: a step is scheduled before the previous step's tokens are known
(the request's in-flight tokens are placeholders), so finished requests free
their blocks one step later, and a request preempted while a step of it is in
flight still receives that step's token and is not re-admitted before.

Runs of steps in which every running request decodes one token are
advanced by the engine in one event (:mod:`orcasim.policies.vllm_v1.runs`);
a running request decoding inside a block it holds does not call the cache
manager (the lazy decode path of :mod:`orcasim.policies.vllm_v1.schedule`).

Per-request block tables live in :class:`~orcasim.kv.cache_manager.KVCacheManager`.
Request ``prefix_id``/``prefix_len`` (and ``hash_ids``) describe shared prompt
content for the prefix cache; generated tokens are shared content, as with the
stub model of vLLM's conformance harness. ``empty_steps`` keeps schedule calls
that schedule nothing as steps of their own (for step-clock traces); off, they
take no time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterator
from typing import Any, Literal

import simpy
from pydantic import AliasChoices, Field, model_validator

from orcasim.context import SchedulerContext
from orcasim.errors import ScenarioError, SimulationError
from orcasim.kv.cache_manager import KVCacheManager
from orcasim.kv.config import MAX_BLOCK_SIZE, MemoryLayout
from orcasim.kv.pool import KVPool
from orcasim.plan import StepPlan
from orcasim.policies.base import PolicyParams, TokenPolicy
from orcasim.policies.vllm_v1.admit import Admission
from orcasim.policies.vllm_v1.group import DecodeGroup
from orcasim.policies.vllm_v1.lazy import LazyDecode
from orcasim.policies.vllm_v1.output import Output
from orcasim.policies.vllm_v1.runs import VllmRuns
from orcasim.policies.vllm_v1.schedule import Scheduling
from orcasim.policies.vllm_v1.state import (
    KIND_NAMES,
    KIND_NEW,
    KIND_RESUMED,
    KIND_RUNNING,
    MAX_EMPTY_SCHEDULES,
    MAX_MANAGED_BLOCKS,
    PREEMPTED,
    RUNNING,
    WAITING,
    Seq,
    StepObserver,
    StepOutput,
    misfit,
    misfit_reason,
)
from orcasim.registry import policies
from orcasim.request import Request
from orcasim.workload.base import MAX_TOKENS_PER_REQUEST

__all__ = [
    "KIND_NAMES",
    "KIND_NEW",
    "KIND_RESUMED",
    "KIND_RUNNING",
    "PREEMPTED",
    "RUNNING",
    "WAITING",
    "Seq",
    "StepObserver",
    "StepOutput",
    "VllmV1",
    "misfit",
    "misfit_reason",
]


@policies.register("vllm-v1")
class VllmV1(VllmRuns, LazyDecode, Scheduling, Admission, Output, TokenPolicy):
    """vLLM V1's scheduler: one token budget, running first, recompute preemption, prefix cache."""

    class Params(PolicyParams):
        block_size: int = Field(16, gt=0, le=MAX_BLOCK_SIZE, description="tokens per KV block")
        num_blocks: int = Field(1024, ge=2, le=MAX_MANAGED_BLOCKS,
                                description="KV blocks, block 0 being the null block")
        max_num_seqs: int = Field(256, gt=0, le=1_000_000, description="running requests at "
                                  "most (also "
                                  "accepted as max_batch)",
                                  validation_alias=AliasChoices("max_num_seqs", "max_batch"))
        max_num_batched_tokens: int = Field(2048, gt=0, le=MAX_TOKENS_PER_REQUEST,
                                            description="token budget per step")
        enable_prefix_caching: bool = True
        policy: Literal["fcfs", "priority"] = Field(
            "fcfs", description="queue order and victim: by arrival, or by (priority, arrival)")
        enable_chunked_prefill: bool = True
        long_prefill_token_threshold: int = Field(
            0, ge=0, description="tokens per request and step at most when others wait (0: off)")
        scheduler_reserve_full_isl: bool = Field(
            True, description="admit only if the whole known sequence fits")
        watermark: float = Field(
            0.0, ge=0.0, lt=1.0, description="share of num_blocks kept free at admission")
        max_model_len: int = Field(8192, gt=1, le=MAX_TOKENS_PER_REQUEST,
                                   description="tokens per sequence at most")
        async_scheduling: bool = Field(
            False, description="two steps in flight: schedule before the last step's tokens")
        input_lag: bool = Field(
            True, description="with async_scheduling: a request that arrives while a step "
            "runs is first scheduled in the step after next, as in vLLM's engine loop (off: "
            "in the next step, as when arrivals are given by schedule call)")
        empty_steps: bool = Field(
            False, description="a schedule call that schedules nothing is a step (step clock)")
        preemption: Literal["recompute"] = Field(
            "recompute", description="how a victim gives its blocks back: recompute only, as "
            "in vLLM V1 (it has no swap space)")

        @model_validator(mode="after")
        def _check_vllm_config(self) -> VllmV1.Params:
            # vLLM's SchedulerConfig rejects these combinations.
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must "
                                 f"be >= max_num_seqs ({self.max_num_seqs})")
            if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
                raise ValueError(f"without chunked prefill, max_num_batched_tokens "
                                 f"({self.max_num_batched_tokens}) must be >= max_model_len "
                                 f"({self.max_model_len})")
            if self.long_prefill_token_threshold > self.max_model_len:
                raise ValueError(f"long_prefill_token_threshold "
                                 f"({self.long_prefill_token_threshold}) must be <= "
                                 f"max_model_len ({self.max_model_len})")
            return self

    models_kv_memory = True
    runs_unchanged = True  # all-decode runs (VllmRuns): compared with per-step in the tests

    def __init__(self, params: Params, ctx: SchedulerContext) -> None:
        pool = ctx.kv if ctx is not None else None
        layout = None
        if pool is not None and pool.limited:  # a memory section sizes the cache
            layout = pool.layout
            if not pool.paged:
                raise ScenarioError("memory.allocator", f"vllm-v1 allocates paged blocks; "
                                    f"{layout.allocator!r} is a contiguous reservation")
            if layout.num_blocks + 1 > MAX_MANAGED_BLOCKS:
                raise ScenarioError("memory", f"vllm-v1 keeps a block table of every block: "
                                    f"{layout.num_blocks:,} blocks is more than its limit of "
                                    f"{MAX_MANAGED_BLOCKS - 1:,}")
            params = params.model_copy(update={"num_blocks": layout.num_blocks + 1,
                                               "block_size": layout.block_size})
        super().__init__(params, ctx)
        self._runs = self.runs_unchanged  # its complete_step is its own; VllmRuns handles runs
        # the engine's KV pool holds the blocks; the cache manager allocates them
        self.pool: KVPool | None = None
        if ctx is not None:
            if layout is None:  # sized by the policy's own num_blocks (block 0: the null block)
                layout = MemoryLayout("paged", params.num_blocks - 1, params.block_size, None,
                                      params.max_model_len, 0, 25e9)
            self.pool = ctx.kv = KVPool.of_blocks(ctx.env, layout, ctx.recorder,
                                                  params.enable_prefix_caching)
        self.kv = KVCacheManager(params.num_blocks, params.block_size,
                                 enable_caching=params.enable_prefix_caching,
                                 max_model_len=params.max_model_len,
                                 pool=self.pool.block_pool if self.pool is not None else None)
        self._usable = self.kv.pool.num_usable_blocks  # held blocks: these less the free ones
        self.priority = params.policy == "priority"
        self.watermark_blocks = int(params.watermark * params.num_blocks)
        self._set_limits()
        self._group = DecodeGroup(params.block_size)
        self._lazy = self.lazy_decode and not params.async_scheduling
        self.seqs: dict[int, Seq] = {}
        self._observer: StepObserver | None = None
        self._finished_since_schedule = False
        self._arrivals: list[Request] = []
        self._queue: deque[StepOutput] = deque()  # steps in flight, newest first
        self._queue_size = 2 if params.async_scheduling else 1
        self._empty_steps = params.empty_steps
        self._lagged = params.async_scheduling and params.input_lag
        self._held: deque[Request] = deque()  # arrived, not yet taken (input_lag)
        self._scheduled_at = 0.0  # when the last schedule call ran
        self._current: StepOutput | None = None
        self._update_at_end = False
        # a decision in progress: ready_plan returned None and next_step goes on with it
        self._resume = False
        self._num_empty = 0  # schedule calls of the decision that scheduled nothing
        self._wait_on: simpy.Event | None = None  # what the decision waits on (None: done)
        # prompt tokens at first admission, and how many of them the prefix cache served
        self.num_prompt_tokens_admitted = 0
        self.num_prefix_hit_tokens = 0

    @property
    def observer(self) -> StepObserver | None:
        """Sees every schedule call and output (a trace writer); set before the engine starts."""
        return self._observer

    @observer.setter
    def observer(self, observer: StepObserver | None) -> None:
        # an observer sees every step: no runs, and no lazy arrivals to serve them
        self._observer = observer
        self._runs = observer is None and self.runs_unchanged
        # an observer sees every request's entry in every step: no decode group
        self._sync_group()
        self._lazy = observer is None and self.lazy_decode and not self.params.async_scheduling
        if self._runs:
            self.__dict__.pop("decode_run", None)
        else:
            self.decode_run = None  # type: ignore[assignment]  # spare the engine the ask

    # -- the waiting queue (ctx.waiting, kept in the policy's order) ------------------

    def batch_labels(self, plan: StepPlan) -> tuple[str | None, ...]:
        if plan.scheduled is None:  # a step of the decode group: its members, then the rest
            out = self._current
            rest = out.entries if out is not None and out.plan is plan else ()
            return (tuple(r.label for r in self._group.members[:plan.num_seqs - len(rest)])
                    + tuple(e[0].label for e in rest))
        return super().batch_labels(plan)

    def running_requests(self) -> Iterator[Request]:
        """The running requests, their counters up to date."""
        self._sync_group()
        return iter(self.running)

    def drop(self, req: Request) -> None:
        """Out of the batch (a hard stop), its blocks freed."""
        self._sync_group()
        self.running.remove(req)
        self.kv.free(req)
        if self.pool is not None:
            self.pool.released()

    def cancel(self, req: Request) -> None:
        """Out of the queue or the batch, blocks freed; a step of it in flight is ignored."""
        self._sync_group()
        seq = self.seqs.pop(req.id, None)
        if req in self.running:
            self.running.remove(req)
        elif req in self.ctx.waiting:
            self.ctx.waiting.remove(req)
        elif req in self._held:
            self._held.remove(req)
        if seq is not None:
            self.kv.free(req)
            self.kv.forget(req)
            if self.pool is not None:
                self.pool.released()

    def summary_metrics(self) -> dict[str, float]:
        """Prefix-cache hits at first admission (re-admissions after preemption excluded)."""
        total = self.num_prompt_tokens_admitted
        return {
            "prefix_cache_hit_tokens": self.num_prefix_hit_tokens,
            "prefix_cache_hit_rate": self.num_prefix_hit_tokens / total if total else 0.0,
        }

    def next_step(self) -> Generator[simpy.Event, Any, StepPlan | None]:
        if not self._resume:  # a decision not begun by ready_plan
            plan = self.ready_plan()
            if plan is not None:
                return plan
        self._resume = False
        while self._wait_on is not None:
            yield self._wait_on
            plan = self.ready_plan(False)
            if plan is not None:
                return plan
        return None

    def ready_plan(self, fresh: bool = True) -> StepPlan | None:  # type: ignore[override]
        """The next step's plan when the decision needs no wait (the engine's fast path):
        schedule until a step has a plan, as vLLM's engine loop with its batch queue.

        ``None``: the decision waits on ``_wait_on`` first (``None``: nothing is
        left to run), and :meth:`next_step` carries it on from where it stopped
        (``fresh`` False: a decision carried on).
        """
        if fresh:
            self._num_empty = 0
        ctx = self.ctx
        queue = self._queue
        if self._lazy:  # synchronous, no observer: nothing is in flight between decisions
            self._take_arrivals()
            if self.running:  # (_scheduled_at is read by async scheduling only)
                out = self._schedule_lazily()
                if out is not None:  # every running request decodes: the group's step
                    self._update_at_end = True  # its output is processed after it has run
                    self._current = out
                    return self._plan(out)
        while True:
            self._take_arrivals()
            if not self.running and not ctx.waiting and not self._held and ctx.arrivals_done:
                while queue:
                    self._update(queue.pop())
                self._wait_on = None
                self._resume = fresh
                return None
            if self.running or ctx.waiting or self._finished_since_schedule:  # has requests
                self._scheduled_at = ctx.env._now
                out = (self._schedule_fcfs() if self._sync_fcfs and not self._lazy
                       else self._schedule())  # (what _schedule would call)
                if self._observer is not None:
                    self._observer.scheduled(self, out)
                if self._queue_size == 1:  # synchronous: nothing else is in flight
                    self._update_at_end = True  # (as the queue would say)
                else:
                    queue.appendleft(out)
                    if not (len(queue) < self._queue_size
                            and (out.num_tokens or self._has_requests())):
                        oldest = queue.pop()
                        if oldest is out:
                            self._update_at_end = True  # after the step has run
                        else:
                            self._update(oldest)
                if out.num_tokens or self._empty_steps:
                    self._current = out
                    return self._plan(out)
                # Nothing scheduled: in simulated time the call takes no time.
                out.t_end = out.prev_end = ctx.now
                if self._update_at_end:
                    self._update_at_end = False
                    self._update(out)
                self._num_empty += 1
                held = self.running or ctx.waiting
                stuck = bool(held) and not out.preempted and not any(o.num_tokens for o in queue)
                if self._num_empty > MAX_EMPTY_SCHEDULES or (stuck and ctx.arrivals_done):
                    who = f"request {held[0].label}" if held else "anything"
                    raise SimulationError(
                        f"policy 'vllm-v1' cannot schedule {who} at t={ctx.now:.6g}: "
                        "nothing is in flight and nothing fits")
                if stuck:  # only an arrival can change anything
                    self._wait_on = ctx.arrival
                    self._resume = fresh
                    return None
            elif not queue:
                self._wait_on = ctx.arrival
                self._resume = fresh
                return None
            else:
                self._update(queue.pop())

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        out = self._current
        assert out is not None and out.plan is plan
        out.t_end = t_end
        out.prev_end = self.ctx.last_step_end
        pool = self.pool
        if pool is not None and pool.series is not None:
            pool.observe(t_start, t_end, plan.num_kv_tokens + out.num_tokens, False)
        if self._update_at_end:
            self._update_at_end = False
            self._update(out, plan)
