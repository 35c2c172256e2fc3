"""``UnlimitedKV``: ``ctx.kv`` of a run without a ``memory:`` section.

It has the face of :class:`~orcasim.kv.pool.KVPool` (the read-outs, the
non-blocking try, the blocking get, the ``freed`` event) so that code written
against ``ctx.kv`` (an admission controller, a policy, a helper process)
runs unchanged in every scenario. Memory is never short: every allocation
succeeds at once and nothing is counted. ``freed`` never fires, since nothing
is ever waited for; policies check :attr:`limited` and skip the bookkeeping.
"""

from __future__ import annotations

from typing import Any

import simpy

from orcasim.request import Request

#: blocks an unlimited pool reports as usable and free
UNLIMITED_BLOCKS = 1 << 62


class UnlimitedKV:
    """KV memory without a limit."""

    limited = False
    paged = True
    can_swap = False
    has_getters = False

    def __init__(self, env: simpy.Environment, block_size: int = 16) -> None:
        self.env = env
        self.block_size = block_size
        self.capacity_units = UNLIMITED_BLOCKS
        self.num_usable_blocks = UNLIMITED_BLOCKS
        self.num_free_blocks = UNLIMITED_BLOCKS
        self.free_units = UNLIMITED_BLOCKS
        self.usage = 0.0
        self._freed: simpy.Event | None = None

    @property
    def freed(self) -> simpy.Event:
        """An event for freed memory: with no limit nothing waits for memory, so it never fires."""
        if self._freed is None:
            self._freed = self.env.event()
        return self._freed

    def get(self, n: int) -> simpy.Event:
        """An event that succeeds with ``n`` at once."""
        if n < 1:
            raise ValueError('"n" must be > 0.')
        ev = self.env.event()
        ev.succeed(n)
        return ev

    def put(self, n: int) -> None:
        """Return blocks taken with :meth:`get` (nothing to do)."""

    def too_long(self, req: Request) -> bool:
        return False

    def holds(self, req: Request) -> bool:
        return False

    def try_allocate(self, req: Request, num_tokens: int, keep_free: int = 0) -> bool:
        return True

    def release(self, req: Request) -> int:
        return 0

    def leaked_blocks(self) -> int:
        return 0

    def summary(self) -> dict[str, Any]:
        """No memory metrics: the scenario does not model memory."""
        return {}
