"""The vllm-v1 policy's per-request counters, step records and fit check (no SimPy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from orcasim.kv.block_table import cdiv
from orcasim.plan import StepPlan
from orcasim.request import Request

if TYPE_CHECKING:
    from orcasim.context import SchedulerContext
    from orcasim.kv.cache_manager import KVCacheManager
    from orcasim.kv.pool import KVPool
    from orcasim.policies.vllm_v1 import VllmV1

WAITING, RUNNING, PREEMPTED = 0, 1, 2
#: blocks of vLLM's pool at most (each is an object with its own table entry)
MAX_MANAGED_BLOCKS = 10_000_000
#: schedule() calls in a row that schedule nothing before a simulated-time run is declared stuck
MAX_EMPTY_SCHEDULES = 1000
#: kinds of a scheduled entry
KIND_RUNNING, KIND_NEW, KIND_RESUMED = 0, 1, 2
KIND_NAMES = ("running", "new", "resumed")


class PolicyState:
    """What the vllm-v1 policy's parts (scheduling, output update, runs) share: the
    attributes :class:`~orcasim.policies.vllm_v1.VllmV1` sets, declared once."""

    params: Any
    ctx: SchedulerContext
    kv: KVCacheManager
    pool: KVPool | None
    running: list[Request]
    seqs: dict[int, Seq]
    _observer: StepObserver | None
    _finished_since_schedule: bool


class Seq:
    """The scheduler's counters for one request, beside :class:`Request`'s own.

    ``num_last``: its known tokens after its last sampled token (its prompt and output,
    at most ``max_model_len``); ``num_placeholders``: sampled tokens still in flight
    (async scheduling);
    ``num_in_flight``: tokens scheduled in steps whose output is not processed
    (kept under async scheduling only: synchronously, a step's output is
    processed before the next schedule call, so nothing is ever in flight
    there); ``num_stale``: in-flight tokens of a step scheduled before a
    preemption.
    """

    __slots__ = ("base", "num_in_flight", "num_last", "num_placeholders", "num_prompt",
                 "num_stale", "status")

    def __init__(self, req: Request, max_model_len: int) -> None:
        self.status = WAITING
        self.num_prompt = num_prompt = req.prompt_len or 1  # max(prompt_len, 1): never negative
        # known tokens once it samples its last token: its output, or a full context
        last = num_prompt + req.output_len
        self.num_last = last if last < max_model_len else max_model_len
        self.num_placeholders = 0
        self.num_in_flight = 0
        self.num_stale = 0
        self.base = 0  # in a DecodeGroup: computed tokens less the group's count


class StepOutput:
    """One schedule() call: its entries ``[request, n, start, kind, emits]`` and its effects.

    With ``num_group``, the first ``num_group`` running requests (a
    :class:`~orcasim.policies.vllm_v1.group.DecodeGroup`) each decode one
    token ahead of ``entries``, as entries ``[req, 1, start, KIND_RUNNING, True]``
    would say.
    """

    __slots__ = ("arrivals", "entries", "group_at", "num_decode", "num_emits", "num_group",
                 "num_tokens", "plan", "preempted", "prev_end", "t_end")

    def __init__(self, entries: list[list[Any]], preempted: list[Request],
                 arrivals: list[Request], num_tokens: int | None = None, num_decode: int = 0,
                 num_emits: int = 0) -> None:
        self.entries = entries
        self.preempted = preempted
        self.arrivals = arrivals
        self.num_tokens = sum(e[1] for e in entries) if num_tokens is None else num_tokens
        self.num_decode = num_decode  # entries computing one token past the prompt
        self.num_emits = num_emits  # entries that sample a token
        # the decode group's members, each decoding a token before ``entries`` (not listed
        # there), and the group's count before the step
        self.num_group = 0
        self.group_at = 0
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

