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

Per-request block tables live in :class:`~orcasim.kv.cache_manager.KVCacheManager`.
Request ``prefix_id``/``prefix_len`` (and ``hash_ids``) describe shared prompt
content for the prefix cache; generated tokens are shared content, as with the
stub model of vLLM's conformance harness. ``empty_steps`` keeps schedule calls
that schedule nothing as steps of their own (for step-clock traces); off, they
take no time.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Generator
from typing import Any, Literal, Protocol

import simpy
from pydantic import AliasChoices, Field, model_validator

from orcasim.context import SchedulerContext
from orcasim.errors import ScenarioError, SimulationError
from orcasim.kv.block_table import cdiv
from orcasim.kv.cache_manager import KVCacheManager
from orcasim.kv.config import MAX_BLOCK_SIZE, MemoryLayout
from orcasim.kv.pool import KVPool
from orcasim.plan import StepPlan
from orcasim.policies.base import PolicyParams, TokenPolicy
from orcasim.registry import policies
from orcasim.request import Request
from orcasim.workload.base import MAX_TOKENS_PER_REQUEST

WAITING, RUNNING, PREEMPTED = 0, 1, 2
#: blocks of vLLM's pool at most (each is an object with its own table entry)
MAX_MANAGED_BLOCKS = 10_000_000
#: schedule() calls in a row that schedule nothing before a simulated-time run is declared stuck
MAX_EMPTY_SCHEDULES = 1000
#: kinds of a scheduled entry
KIND_RUNNING, KIND_NEW, KIND_RESUMED = 0, 1, 2
KIND_NAMES = ("running", "new", "resumed")


class _Seq:
    """The scheduler's counters for one request, beside :class:`Request`'s own.

    ``num_placeholders``: sampled tokens still in flight (async scheduling);
    ``num_in_flight``: tokens scheduled in steps whose output is not processed;
    ``num_stale``: in-flight tokens of a step scheduled before a preemption.
    """

    __slots__ = ("num_in_flight", "num_placeholders", "num_prompt", "num_stale", "status")

    def __init__(self, req: Request) -> None:
        self.status = WAITING
        self.num_prompt = max(req.prompt_len, 1)
        self.num_placeholders = 0
        self.num_in_flight = 0
        self.num_stale = 0


class StepOutput:
    """One schedule() call: its entries ``[request, n, start, kind, emits]`` and its effects."""

    __slots__ = ("arrivals", "entries", "num_tokens", "plan", "preempted", "prev_end", "t_end")

    def __init__(self, entries: list[list[Any]], preempted: list[Request],
                 arrivals: list[Request]) -> None:
        self.entries = entries
        self.preempted = preempted
        self.arrivals = arrivals
        self.num_tokens = sum(e[1] for e in entries)
        self.plan: StepPlan | None = None
        self.t_end = 0.0
        self.prev_end = 0.0


class StepObserver(Protocol):
    """Sees every schedule() call and every processed output (e.g. a trace writer)."""

    def scheduled(self, policy: VllmV1, out: StepOutput) -> None: ...

    def updated(self, policy: VllmV1, out: StepOutput, finished: list[Request]) -> None: ...


def misfit(prompt_len: int, output_len: int, params: Any) -> tuple[str, str] | None:
    """Why a request can never run under ``params``: ``(reason, detail)``, or None if it can.

    The reason is one of a fixed vocabulary (``exceeds_max_model_len``,
    ``exceeds_kv_capacity``), the detail says by how much. Alone in the
    engine, a request needs slots for ``prompt_len + output_len - 1`` tokens
    (the last token is sampled, never computed), capped at ``max_model_len``;
    the pool has ``num_blocks - 1`` usable blocks.
    """
    if prompt_len > params.max_model_len:
        return ("exceeds_max_model_len",
                f"prompt_len {prompt_len} exceeds max_model_len {params.max_model_len}")
    tokens = min(max(prompt_len, 1) + output_len - 1, params.max_model_len)
    need = cdiv(tokens, params.block_size)
    if need > params.num_blocks - 1:
        return ("exceeds_kv_capacity", f"needs {need} KV blocks of {params.block_size} tokens, "
                f"the pool has {params.num_blocks - 1}")
    return None


def misfit_reason(prompt_len: int, output_len: int, params: Any) -> str | None:
    """The detail of :func:`misfit` (None if the request can run)."""
    found = misfit(prompt_len, output_len, params)
    return None if found is None else found[1]


@policies.register("vllm-v1")
class VllmV1(TokenPolicy):
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
        self.priority = params.policy == "priority"
        self.watermark_blocks = int(params.watermark * params.num_blocks)
        self.seqs: dict[int, _Seq] = {}
        self.observer: StepObserver | None = None
        self._finished_since_schedule = False
        self._arrivals: list[Request] = []
        self._queue: deque[StepOutput] = deque()  # steps in flight, newest first
        self._queue_size = 2 if params.async_scheduling else 1
        self._current: StepOutput | None = None
        self._update_at_end = False
        # prompt tokens at first admission, and how many of them the prefix cache served
        self.num_prompt_tokens_admitted = 0
        self.num_prefix_hit_tokens = 0

    # -- the waiting queue (ctx.waiting, kept in the policy's order) ------------------
    @staticmethod
    def _order(req: Request) -> tuple[int, float, int]:
        return (req.priority, req.arrival, req.id)

    def _enqueue_front(self, req: Request) -> None:
        if self.priority:
            bisect.insort(self.ctx.waiting, req, key=self._order)
        else:
            self.ctx.waiting.appendleft(req)

    def _take_arrivals(self) -> None:
        """Move requests the source just appended to ``ctx.waiting`` into the policy's queue.

        The source only appends at the right; the policy reorders the queue only
        during a schedule call, right after taking the new arrivals, so the
        requests it does not know yet are exactly those at the right end.
        """
        ctx = self.ctx
        ctx.poll_arrivals()
        waiting, seqs = ctx.waiting, self.seqs
        if not waiting or waiting[-1].id in seqs:
            return
        fresh = []
        while waiting and waiting[-1].id not in seqs:
            fresh.append(waiting.pop())
        for req in reversed(fresh):
            found = misfit(req.prompt_len, req.output_len, self.params)
            if found is not None:
                ctx.reject(req, found[0])
                continue
            seqs[req.id] = _Seq(req)
            self.kv.update_hashes(req)
            self._arrivals.append(req)
            if self.priority:
                bisect.insort(waiting, req, key=self._order)
            else:
                waiting.append(req)

    def _has_requests(self) -> bool:
        return bool(self.running or self.ctx.waiting or self._finished_since_schedule)

    # -- one schedule() call -----------------------------------------------------------
    def _preempt(self, req: Request) -> None:
        seq = self.seqs[req.id]
        self.ctx.preempted(req, "kv_full", recompute=req.num_computed_tokens)
        self.kv.free(req)
        seq.status = PREEMPTED
        seq.num_stale = seq.num_in_flight
        seq.num_placeholders = 0
        req.num_computed_tokens = 0
        self._enqueue_front(req)
        if self.pool is not None:
            self.pool.released()

    def _schedule(self) -> StepOutput:
        p = self.params
        kv, seqs, running = self.kv, self.seqs, self.running
        waiting = self.ctx.waiting
        budget = p.max_num_batched_tokens
        max_len = p.max_model_len
        threshold = p.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        scheduled: dict[int, list[Any]] = {}  # request id -> [req, n, start, kind, emits]
        preempted: list[Request] = []

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            seq = seqs[req.id]
            computed = req.num_computed_tokens
            if seq.num_placeholders and (computed + 2 - seq.num_placeholders
                                         >= seq.num_prompt + req.output_len):
                i += 1  # its last token is already in flight
                continue
            n = req.num_tokens + seq.num_placeholders - computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, max_len - computed - 1)
            if n <= 0:
                i += 1
                continue
            fits = True
            while kv.allocate_slots(req, n) is None:
                if self.priority:
                    victim = max(running, key=self._order)
                    j = running.index(victim)
                    del running[j]
                    if j < i:
                        i -= 1
                    gone = scheduled.pop(victim.id, None)
                    if gone is not None:
                        budget += gone[1]
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    fits = False
                    break
            if not fits:
                if self.priority:
                    continue  # it left the list; the requests after it may still fit
                break
            scheduled[req.id] = [req, n, computed, KIND_RUNNING, False]
            budget -= n
            i += 1

        if not preempted:
            skipped: list[Request] = []
            while budget > 0 and waiting and len(running) < p.max_num_seqs:
                req = waiting[0]
                seq = seqs[req.id]
                if seq.num_stale:  # a step of it is still in flight
                    skipped.append(waiting.popleft())
                    continue
                hit, num_hit = kv.get_computed_blocks(req)
                n = req.num_tokens - num_hit
                if 0 < threshold < n:
                    n = threshold
                if not p.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if kv.allocate_slots(req, n, hit, num_hit,
                                     full_sequence_must_fit=p.scheduler_reserve_full_isl,
                                     watermark_blocks=self.watermark_blocks if running else 0
                                     ) is None:
                    break
                waiting.popleft()
                running.append(req)
                kind = KIND_RESUMED if req.num_preemptions else KIND_NEW
                if kind == KIND_NEW:
                    self.num_prompt_tokens_admitted += req.prompt_len
                    self.num_prefix_hit_tokens += min(num_hit, req.prompt_len)
                scheduled[req.id] = [req, n, num_hit, kind, False]
                budget -= n
                seq.status = RUNNING
                req.num_computed_tokens = num_hit
                self.ctx.admit(req)
            for req in reversed(skipped):
                self._enqueue_front(req)

        # advance the computed tokens now, so the next step can be scheduled at once
        use_placeholders = p.async_scheduling
        entries = list(scheduled.values())
        for e in entries:
            req, n = e[0], e[1]
            seq = seqs[req.id]
            req.num_computed_tokens += n
            seq.num_in_flight += n
            emits = req.num_computed_tokens >= req.num_tokens + seq.num_placeholders
            e[4] = emits
            if emits and use_placeholders:
                seq.num_placeholders += 1
        self._finished_since_schedule = False
        out = StepOutput(entries, preempted, self._arrivals)
        self._arrivals = []
        return out

    # -- processing a step's output ----------------------------------------------------
    def _update(self, out: StepOutput, plan: StepPlan | None = None) -> None:
        """Apply a step's sampled tokens (``plan``: the step being completed, for its ITL count)."""
        kv, seqs, ctx = self.kv, self.seqs, self.ctx
        max_len = self.params.max_model_len
        block_size = self.params.block_size
        t_end, prev_end = out.t_end, out.prev_end
        bulk = 0
        finished: list[Request] = []
        left_running: set[int] = set()
        left_waiting: set[int] = set()
        for req, n, _, _, emits in out.entries:
            seq = seqs.get(req.id)
            if seq is None:  # finished by an earlier step's output
                continue
            seq.num_in_flight -= n
            stale = seq.num_stale > 0
            if stale:
                seq.num_stale -= n
            if not emits:
                continue
            had_placeholders = seq.num_placeholders > 0
            if req.num_output_tokens == 0:
                req.first_token = t_end
            elif req.last_token == prev_end:
                bulk += 1
            else:
                ctx.recorder.record_itl(t_end - req.last_token)  # type: ignore[operator]
            req.num_output_tokens += 1
            req.last_token = t_end
            if req.num_tokens % block_size == 0:  # a block of known tokens just filled
                kv.update_hashes(req)
            if not stale and had_placeholders:
                seq.num_placeholders -= 1
                if seq.status == RUNNING:
                    kv.cache_blocks(req, req.num_computed_tokens - seq.num_in_flight)
            if req.num_tokens >= max_len or req.num_output_tokens >= req.output_len:
                if req.num_output_tokens < req.output_len:
                    req.reason = "max_model_len"  # finished early: the context is full
                (left_running if seq.status == RUNNING else left_waiting).add(req.id)
                del seqs[req.id]
                kv.free(req)
                kv.forget(req)
                finished.append(req)
                if self.pool is not None:
                    self.pool.released()
        if plan is not None:
            plan.num_itl_tokens = bulk
        elif bulk:
            ctx.recorder.record_itl(t_end - prev_end, bulk)
        if left_running:
            self.running = [r for r in self.running if r.id not in left_running]
        if left_waiting:
            kept = [r for r in ctx.waiting if r.id not in left_waiting]
            ctx.waiting.clear()
            ctx.waiting.extend(kept)
        if finished:
            self._finished_since_schedule = True
            for req in finished:
                ctx.finish(req, t_end)
        if self.observer is not None:
            self.observer.updated(self, out, finished)

    # -- the engine loop (vLLM's EngineCore with a batch queue) ----------------------------
    def _plan(self, out: StepOutput) -> StepPlan:
        seqs = self.seqs
        kv_tokens = prefill = decode = 0
        pairs = []
        contexts = []
        for req, n, start, _, _ in out.entries:
            kv_tokens += start
            contexts.append(start)
            if n == 1 and start >= seqs[req.id].num_prompt:
                decode += 1
            else:
                prefill += n
            pairs.append((req, n))
        plan = StepPlan(len(pairs), kv_tokens, prefill, decode, pairs, contexts)
        out.plan = plan
        return plan

    def drop(self, req: Request) -> None:
        """Out of the batch (a hard stop), its blocks freed."""
        self.running.remove(req)
        self.kv.free(req)
        if self.pool is not None:
            self.pool.released()

    def cancel(self, req: Request) -> None:
        """Out of the queue or the batch, blocks freed; a step of it in flight is ignored."""
        seq = self.seqs.pop(req.id, None)
        if req in self.running:
            self.running.remove(req)
        elif req in self.ctx.waiting:
            self.ctx.waiting.remove(req)
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
        ctx = self.ctx
        queue = self._queue
        num_empty = 0
        while True:
            self._take_arrivals()
            if not self.running and not ctx.waiting and ctx.arrivals_done:
                while queue:
                    self._update(queue.pop())
                return None
            if self._has_requests():
                out = self._schedule()
                if self.observer is not None:
                    self.observer.scheduled(self, out)
                queue.appendleft(out)
                if not (len(queue) < self._queue_size
                        and (out.num_tokens or self._has_requests())):
                    oldest = queue.pop()
                    if oldest is out:
                        self._update_at_end = True  # after the step has run
                    else:
                        self._update(oldest)
                if out.num_tokens or self.params.empty_steps:
                    self._current = out
                    return self._plan(out)
                # Nothing scheduled: in simulated time the call takes no time.
                out.t_end = out.prev_end = ctx.now
                if self._update_at_end:
                    self._update_at_end = False
                    self._update(out)
                num_empty += 1
                held = self.running or ctx.waiting
                stuck = bool(held) and not out.preempted and not any(o.num_tokens for o in queue)
                if num_empty > MAX_EMPTY_SCHEDULES or (stuck and ctx.arrivals_done):
                    who = f"request {held[0].label}" if held else "anything"
                    raise SimulationError(
                        f"policy 'vllm-v1' cannot schedule {who} at t={ctx.now:.6g}: "
                        "nothing is in flight and nothing fits")
                if stuck:  # only an arrival can change anything
                    yield ctx.arrival
            elif not queue:
                yield ctx.arrival
            else:
                self._update(queue.pop())

    def complete_step(self, plan: StepPlan, t_start: float, t_end: float) -> None:
        out = self._current
        assert out is not None and out.plan is plan
        out.t_end = t_end
        out.prev_end = self.ctx.last_step_end
        if self.pool is not None:
            self.pool.observe(t_start, t_end, plan.num_kv_tokens + plan.num_tokens, False)
        if self._update_at_end:
            self._update_at_end = False
            self._update(out, plan)
