"""KV memory for token-level policies: allocate as tokens are scheduled, preempt when short.

:class:`TokenMemory` is the mechanism behind every
:class:`~orcasim.policies.common.BatchPolicy` (``fcfs``, ``priority``,
``sarathi``, ``sjf``, ...) when the scenario has a ``memory`` section; the
policies keep only their decisions (the order, the victim). With vLLM's rule:

- a scheduled request holds memory for the tokens it will have computed
  after the step (``num_computed_tokens + n``): paged, whole blocks taken as
  it grows; a reservation allocator, its whole region when it is admitted;
- a running request that cannot get its memory preempts the policy's victim
  (the last admitted, or the least important), possibly itself, until it fits;
- a waiting request is admitted only if its memory fits, leaving
  ``watermark`` x the pool free while others run; otherwise it waits at the
  head of the queue (and a preemptive policy may preempt a less important
  running request for it);
- a victim gives its memory back by ``recompute`` (it computes its tokens
  again when it runs again) or ``swap`` (its blocks move to the CPU swap
  space at PCIe bandwidth; the copy time is added to the step that swaps).
  Swapped requests come back first come first served, before any new
  admission; swapping falls back to recompute when the swap space is full.

A request whose whole life (prompt plus output) cannot fit in the pool even
alone is rejected when it reaches the head of the queue
(``exceeds_kv_capacity``), as is one longer than ``max_model_len``
(``exceeds_max_model_len``): it could never finish.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from orcasim.errors import ScenarioError
from orcasim.kv.block_table import cdiv
from orcasim.kv.config import footprint
from orcasim.request import Request


class TokenMemory:
    """Allocation, watermark, swap space and swap time of one token policy on ``ctx.kv``."""

    def __init__(self, kv: Any, preemption: str, watermark: float) -> None:
        self.kv = kv
        self.swap = preemption == "swap"
        if self.swap and not kv.can_swap:
            raise ScenarioError("policy.preemption", "swap needs a paged pool, swap_space_gb > 0 "
                                "and the KV bytes per token (memory.model or bytes_per_token)")
        self.keep_free = int(watermark * kv.capacity_units) if kv.paged else 0
        #: a paged pool's blocks per request id (a fast check that a request needs no block)
        self.held: dict[int, int] | None = kv.alloc.held if kv.paged else None
        self.swapped: deque[Request] = deque()
        #: swap-copy seconds to charge to the step being planned
        self.swap_secs = 0.0
        #: a request waited for memory while planning this step (free memory was stranded)
        self.blocked = False
        #: the waiting request the latest :meth:`admit` refused (None after one it admits)
        self.refused: Request | None = None
        #: after a run of decode steps, the running requests that need a block at the next
        #: boundary (:class:`~orcasim.policies.token_mem_runs.MemoryRuns`)
        self.needy: list[Request] = []
        #: the policy's decode pool under memory (MemoryRuns.bind), or None: in a paged pool a
        #: :class:`~orcasim.policies.growing_pool.GrowingPool`, whose members take their blocks
        #: by phase (then nobody is noted in :attr:`needy`)
        self.pool: Any = None

    def misfit(self, req: Request) -> str | None:
        """Why ``req`` could never finish in this pool, or None."""
        kv = self.kv
        if kv.too_long(req):
            return "exceeds_max_model_len"
        if kv.paged:
            need = cdiv(footprint(req.prompt_len, req.output_len), kv.block_size)
        else:
            need = kv.need(req)
        return "exceeds_kv_capacity" if need > kv.capacity_units else None

    def admit(self, req: Request, num_tokens: int, others_running: bool) -> bool:
        """Memory for a waiting ``req`` to compute up to ``num_tokens`` tokens; False if short."""
        ok: bool = self.kv.try_allocate(req, num_tokens, self.keep_free if others_running else 0)
        if ok:
            self.refused = None
        else:
            self.blocked = True
            self.refused = req
        return ok

    def grow_after_run(self) -> bool:
        """Right after a run, before the batch changed: give each running request that needs
        one a block for its next token, if the free blocks cover them all (then the order
        in which they take them changes nothing); False, changing nothing, if not: each
        then takes its block in the step rule's own pass (a decode pool's members due have
        their counters written for it: ``GrowingPool.grow_now``)."""
        pool = self.pool
        if pool is not None and self.kv.paged:
            return bool(pool.grow_now(self.kv))
        needy = self.needy
        if not needy:
            return True
        self.needy = []
        kv = self.kv
        if len(needy) > kv.alloc.num_free_blocks:
            return False
        for req in needy:
            kv.try_allocate(req, req.num_computed_tokens + 1)
        return True

    def settle(self) -> None:
        """Before the step rule's own pass over the running requests, which checks each
        one's memory: the decode pool's members as that pass reads them (in a paged pool
        see ``GrowingPool.settle``; otherwise it is emptied, its members up to date)."""
        pool = self.pool
        if pool is not None:
            if self.kv.paged:
                pool.settle()
            else:
                pool.clear()

    def swap_out(self, req: Request) -> bool:
        """Move ``req``'s blocks to the swap space (True), or False when it is full."""
        if self.pool is not None:
            self.pool.leave(req)  # (its counters up to date: it keeps them while swapped)
        secs = self.kv.swap_out(req)
        if secs is None:
            return False
        self.swap_secs += secs
        self.swapped.append(req)
        return True

    def swap_in(self, req: Request, num_tokens: int, others_running: bool) -> bool:
        """Bring the first swapped request back with room for ``num_tokens``; False if short."""
        secs = self.kv.swap_in(req, self.keep_free if others_running else 0, num_tokens)
        if secs is None:
            self.blocked = True
            return False
        self.swapped.popleft()
        self.swap_secs += secs
        return True

    def take_swap_time(self) -> float:
        """Seconds of swapping planned since the last call (charged to the step)."""
        secs, self.swap_secs = self.swap_secs, 0.0
        return secs
