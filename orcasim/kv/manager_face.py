"""``CacheManagerKV``: ``ctx.kv`` of a ``vllm-v1`` run, over the policy's own block pool.

The ``vllm-v1`` policy allocates with vLLM's rules
(:class:`~orcasim.kv.cache_manager.KVCacheManager`: block tables, prefix
cache, reuse-first free order). This face gives everyone else the same view
of that pool as of a :class:`~orcasim.kv.pool.KVPool`: ``block_size``,
``num_free_blocks`` (evictable cached blocks included, as vLLM counts them),
``num_usable_blocks``, ``usage`` and the ``freed`` event, so admission
controllers (``kv_fit``) and helper processes work on it unchanged.
"""

from __future__ import annotations

from typing import Any

import simpy

from orcasim.kv.cache_manager import KVCacheManager
from orcasim.request import Request


class CacheManagerKV:
    """Read-outs and the ``freed`` event of a :class:`KVCacheManager`'s pool."""

    limited = True
    paged = True
    can_swap = False
    has_getters = False

    def __init__(self, env: simpy.Environment, manager: KVCacheManager) -> None:
        self.env = env
        self.manager = manager
        self.block_size = manager.block_size
        self.num_usable_blocks = manager.pool.num_usable_blocks
        self.capacity_units = self.num_usable_blocks
        self._freed: simpy.Event | None = None
        self.peak_usage = 0.0
        self._usage_dt = 0.0
        self._busy = 0.0

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    @property
    def free_units(self) -> int:
        return self.manager.num_free_blocks

    @property
    def usage(self) -> float:
        return self.manager.pool.usage()

    @property
    def freed(self) -> simpy.Event:
        """An event that fires the next time the policy frees blocks."""
        if self._freed is None:
            self._freed = self.env.event()
        return self._freed

    def released(self) -> None:
        """The policy freed blocks: fire ``freed``."""
        ev = self._freed
        if ev is not None:
            self._freed = None
            ev.succeed(self.num_free_blocks)

    def too_long(self, req: Request) -> bool:
        return False

    def holds(self, req: Request) -> bool:
        return req.id in self.manager.tables

    def release(self, req: Request) -> int:
        """Free ``req``'s blocks (a request dropped by a hard stop)."""
        n = len(self.manager.tables.get(req.id, ()))
        self.manager.free(req)
        self.released()
        return n

    def try_allocate(self, req: Request, num_tokens: int, keep_free: int = 0) -> bool:
        raise TypeError("vllm-v1 allocates its own blocks (vLLM's allocate_slots); "
                        "ctx.kv is read-only there")

    def leaked_blocks(self) -> int:
        """Blocks still referenced by requests (cached blocks that nobody holds are free)."""
        return self.manager.pool.num_held_blocks

    def observe(self, t_start: float, t_end: float) -> None:
        """The pool's usage during a step (for ``kv_peak_usage`` and ``kv_mean_usage``)."""
        u = self.usage
        if u > self.peak_usage:
            self.peak_usage = u
        dt = t_end - t_start
        self._usage_dt += u * dt
        self._busy += dt

    def summary(self) -> dict[str, Any]:
        return {
            "kv_num_blocks": self.num_usable_blocks,
            "kv_block_size": self.block_size,
            "kv_capacity_tokens": self.num_usable_blocks * self.block_size,
            "kv_peak_usage": self.peak_usage,
            "kv_mean_usage": self._usage_dt / self._busy if self._busy else float("nan"),
        }
