"""``KVPool``: the GPU's KV memory as a SimPy resource, shared by a policy through ``ctx.kv``.

Like a SimPy container of blocks: a policy that cannot admit a request for
lack of memory waits for an event instead of polling.

- ``yield kv.freed`` resumes the next time memory is released (a request
  finished or was preempted, blocks were returned): the event's value is the
  number of free units (blocks, or slots for a reservation allocator).
- ``n = yield kv.get(n)`` takes ``n`` blocks of a paged pool as soon as they
  are free (first come, first served); ``kv.put(n)`` returns them. Memory held
  this way counts as allocated.

Requests' own memory goes through :meth:`admit`, :meth:`try_allocate` and
:meth:`release` (the allocator's operations, plus the events), swapping
through :meth:`swap_out` and :meth:`swap_in`: a swapped-out request holds CPU
blocks, bounded by the swap space, and moving them costs ``bytes /
pcie_bandwidth`` seconds, which the policy charges.

:meth:`observe` records one step's memory state in the recorder's KV series;
:meth:`summary` turns the series and the counters into summary metrics.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import simpy

from orcasim.kv.allocators import BlockPoolAllocator, make_allocator
from orcasim.kv.config import MemoryLayout, MemoryOptions, resolve
from orcasim.metrics.kv_series import BUFFER as KV_BUFFER
from orcasim.metrics.kv_series import KVSeries
from orcasim.request import Request

if TYPE_CHECKING:
    from orcasim.metrics.recorder import Recorder


class KVGet(simpy.Event):
    """A request for ``n`` blocks; succeeds with ``n`` when they are free."""

    def __init__(self, pool: KVPool, n: int) -> None:
        super().__init__(pool.env)
        if n < 1:
            raise ValueError('"n" must be > 0.')
        self.n = n
        pool._getters.append(self)
        pool._serve()


class KVPool:
    """KV memory of one engine: an allocator, swap space, wait events and counters."""

    #: False only for :class:`UnlimitedKV`: policies then skip memory bookkeeping
    limited = True

    def __init__(self, env: simpy.Environment, layout: MemoryLayout,
                 recorder: Recorder | None = None, alloc: Any = None) -> None:
        self.env = env
        self.layout = layout
        self.alloc = make_allocator(layout) if alloc is None else alloc
        self.paged: bool = self.alloc.paged
        self.capacity = self.alloc.capacity  # token slots
        self.block_size = layout.block_size
        self._freed: simpy.Event | None = None
        self._getters: deque[KVGet] = deque()
        self._swapped: dict[int, int] = {}  # request id -> CPU blocks
        self.num_swap_blocks_used = 0
        self.num_taken = 0  # blocks taken with get() and not yet put back
        self.peak_allocated = 0
        self.num_releases = 0  # memory returned this many times (holes may have changed)
        # counters reported in the summary (preemptions are counted by the context)
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.swapped_bytes = 0
        self.swap_time = 0.0
        self.series: KVSeries | None = None
        if recorder is not None:
            self.series = recorder.kv = KVSeries(recorder.series.capacity, self.capacity)

    @classmethod
    def from_options(cls, env: simpy.Environment, opts: MemoryOptions,
                     recorder: Recorder | None = None) -> KVPool:
        return cls(env, resolve(opts), recorder)

    @classmethod
    def of_blocks(cls, env: simpy.Environment, layout: MemoryLayout,
                  recorder: Recorder | None = None, enable_caching: bool = True) -> KVPool:
        """A paged pool of block objects (``alloc.block_pool``), for a cache manager."""
        return cls(env, layout, recorder, BlockPoolAllocator(layout, enable_caching))

    @property
    def block_pool(self) -> Any:
        """The block objects of a pool made with :meth:`of_blocks` (None otherwise)."""
        return getattr(self.alloc, "block_pool", None)

    def released(self) -> None:
        """Blocks were freed outside :meth:`release` (by a cache manager): serve gets, fire
        ``freed``."""
        self._released()

    # -- events -------------------------------------------------------------
    @property
    def freed(self) -> simpy.Event:
        """An event that fires the next time memory is released (a fresh one after each)."""
        ev = self._freed
        if ev is None:
            ev = self._freed = self.env.event()
        return ev

    def get(self, n: int) -> KVGet:
        """An event that takes ``n`` blocks when they are free (FIFO with other gets)."""
        return KVGet(self, n)

    def put(self, n: int) -> None:
        """Return ``n`` blocks taken with :meth:`get`."""
        self.alloc.put_blocks(n)
        self.num_taken -= n
        self._released()

    @property
    def has_getters(self) -> bool:
        """True while a :meth:`get` waits (admissions then wait behind it)."""
        return bool(self._getters)

    def _serve(self) -> None:
        getters = self._getters
        while getters:
            g = getters[0]
            if self.alloc.take_blocks(g.n) is None:
                break  # head of line: later gets wait behind it
            getters.popleft()
            self.num_taken += g.n
            self._note_peak()
            g.succeed(g.n)

    def _released(self) -> None:
        self.num_releases += 1
        if self._getters:
            self._serve()
        ev = self._freed
        if ev is not None:
            self._freed = None
            ev.succeed(self.alloc.free_units)

    def _note_peak(self) -> None:
        a = self.alloc.allocated_slots
        if a > self.peak_allocated:
            self.peak_allocated = a

    # -- requests' memory -----------------------------------------------------
    @property
    def capacity_units(self) -> int:
        """Blocks (paged) or slots (reservation) the whole pool holds."""
        return self.alloc.capacity_units

    @property
    def free_units(self) -> int:
        return self.alloc.free_units

    # -- read-outs (the same on every allocator, in blocks of ``block_size`` tokens) -----
    @property
    def num_usable_blocks(self) -> int:
        """Blocks the whole pool holds (a reservation pool: its slots / block size)."""
        return self.capacity // self.block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks free now (a reservation pool: free slots / block size, holes summed)."""
        free = self.alloc.free_units
        return free if self.paged else free // self.block_size

    @property
    def usage(self) -> float:
        """Share of the pool's token slots allocated to requests (or taken with :meth:`get`)."""
        return self.alloc.allocated_slots / self.capacity

    def holds(self, req: Request) -> bool:
        """True while ``req`` holds memory in this pool."""
        return self.alloc.holds(req)

    def try_allocate(self, req: Request, num_tokens: int, keep_free: int = 0) -> bool:
        """Non-blocking: hold memory for ``num_tokens`` tokens of ``req``; False, changing nothing,
        if it does not fit.

        Paged: blocks up to ``ceil(num_tokens / block_size)``, all or nothing; a
        request that holds nothing yet must leave ``keep_free`` blocks free.
        Reservation: the request's whole region, once. Waiting :meth:`get`
        calls go first: while one waits, a request holding nothing is refused.
        """
        alloc = self.alloc
        if self._getters and not alloc.holds(req):
            return False
        if not alloc.allocate_tokens(req, num_tokens, keep_free):
            return False
        a = alloc.allocated_slots
        if a > self.peak_allocated:
            self.peak_allocated = a
        return True

    def need(self, req: Request) -> int:
        """Units ``req`` needs to run now (blocks for its tokens, or its reservation)."""
        return self.alloc.need(req)

    def too_long(self, req: Request) -> bool:
        """True if ``req``'s prompt + output exceeds ``max_model_len``."""
        m = self.layout.max_model_len
        return m is not None and max(req.prompt_len, 1) + req.output_len > m

    def admit(self, req: Request, keep_free: int = 0) -> bool:
        """Give ``req`` memory for its known tokens (or its reservation); False if none fits."""
        alloc = self.alloc
        if self._getters or not alloc.admit(req, keep_free):
            return False
        a = alloc.allocated_slots
        if a > self.peak_allocated:
            self.peak_allocated = a
        return True

    def release(self, req: Request) -> int:
        """Free ``req``'s memory (finished, or preempted by recompute)."""
        n = self.alloc.release(req)
        self._released()
        return n

    def held_blocks(self, req: Request) -> int:
        return self.alloc.held_blocks(req)

    # -- swapping -----------------------------------------------------------
    @property
    def can_swap(self) -> bool:
        """True if blocks can be swapped: a paged pool, known block bytes, some swap space."""
        return self.paged and self.layout.block_bytes is not None and \
            self.layout.num_swap_blocks > 0

    def _transfer_time(self, num_blocks: int) -> tuple[int, float]:
        nbytes = num_blocks * self.layout.block_bytes  # type: ignore[operator]
        return nbytes, nbytes / self.layout.pcie_bandwidth

    def swap_out(self, req: Request) -> float | None:
        """Move ``req``'s blocks to CPU swap space; seconds the copy takes, None if it is full."""
        n = self.alloc.held_blocks(req)
        if not self.can_swap or self.num_swap_blocks_used + n > self.layout.num_swap_blocks:
            return None
        self.alloc.release(req)
        self._swapped[req.id] = n
        self.num_swap_blocks_used += n
        nbytes, secs = self._transfer_time(n)
        self.num_swap_outs += 1
        self.swapped_bytes += nbytes
        self.swap_time += secs
        self._released()
        return secs

    def swap_in(self, req: Request, keep_free: int = 0,
                num_tokens: int | None = None) -> float | None:
        """Move a swapped-out ``req`` back to GPU blocks; seconds it takes, or None if no room.

        It gets blocks for its known tokens, or for ``num_tokens`` when given
        (a token policy: the tokens it had computed).
        """
        if num_tokens is None:
            if not self.admit(req, keep_free):
                return None
        elif not self.try_allocate(req, num_tokens, keep_free):
            return None
        n = self._swapped.pop(req.id)
        self.num_swap_blocks_used -= n
        nbytes, secs = self._transfer_time(n)
        self.num_swap_ins += 1
        self.swapped_bytes += nbytes
        self.swap_time += secs
        return secs

    def discard_swapped(self, req: Request) -> None:
        """Forget a swapped-out ``req`` (aborted): its CPU blocks become free."""
        self.num_swap_blocks_used -= self._swapped.pop(req.id)

    def leaked_blocks(self) -> int:
        """Blocks (GPU or swap) still allocated to requests; 0 once every request has ended."""
        held = self.num_usable_blocks - self.num_free_blocks
        if self.paged:
            held -= self.num_taken
        return held + self.num_swap_blocks_used

    # -- accounting -----------------------------------------------------------
    def observe(self, t_start: float, t_end: float, num_tokens: int, blocked: bool) -> None:
        """Record the memory state during a step: ``num_tokens`` KV tokens held by the batch.

        ``blocked``: a request waited this step because its memory did not fit,
        so the free memory was stranded (external fragmentation, with the
        allocator's padding).
        """
        series = self.series
        if series is None:
            return
        a = self.alloc
        alloc = a.allocated_slots
        if alloc > self.peak_allocated:
            self.peak_allocated = alloc
        series.add(t_start, t_end, num_tokens, alloc, a.internal_slots, a.padding_slots,
                   self.num_swap_blocks_used * self.block_size, blocked)

    def observe_steps(self, ends: list[float], rows: list[tuple[int, int, int, int]],
                      step: int) -> None:
        """:meth:`observe` for the steps of a run, nobody blocked: each row ``(lo, hi,
        num_tokens, allocated)`` stands for steps ``lo..hi-1`` (step ``i`` from ``ends[i - 1]``
        to ``ends[i]``) with ``allocated`` slots allocated, ``num_tokens`` KV tokens in step
        ``lo`` and ``step`` more in each after: :meth:`observe_run` of each row."""
        if self.series is None:
            return
        internal = self.alloc.internal_slots
        for lo, hi, tokens, alloc in rows:
            k = hi - lo
            if k:
                self.observe_run(ends[lo - 1], ends[lo:hi], tokens, step, [alloc] * k,
                                 [internal] * k, False)

    def observe_run(self, t_start: float, ends: list[float], num_tokens: int, size: int,
                    allocated: list[int], internal: list[int], blocked: bool,
                    growing: bool = False) -> None:
        """:meth:`observe` for each step of a run of decode steps from ``t_start``: the batch
        holds ``num_tokens`` KV tokens in the first, ``size`` more in each next, and the
        allocator ``allocated`` and ``internal`` slots in each (padding and swap unchanged).
        ``growing``: ``allocated`` never decreases (its peak is its last)."""
        series = self.series
        if series is None:
            return
        peak = allocated[-1] if growing else max(allocated)
        if peak > self.peak_allocated:
            self.peak_allocated = peak
        # series.add_run, inline (once per run of steps)
        t1 = series._t1
        t1 += ends
        series._alloc += allocated
        series._int += internal
        series._t0.append(t_start)
        series._runs.extend((len(ends), num_tokens, size, self.alloc.padding_slots,
                             self.num_swap_blocks_used * self.block_size, blocked, 1))
        if len(t1) >= KV_BUFFER:
            series.flush(whole=True)

    def summary(self) -> dict[str, Any]:
        """Memory metrics for the run summary (see docs/memory.md)."""
        cap = self.capacity
        out: dict[str, Any] = {
            "kv_num_blocks": self.layout.num_blocks,
            "kv_block_size": self.block_size,
            "kv_capacity_tokens": cap,
        }
        nan = float("nan")
        tot = self.series.totals() if self.series is not None else None
        busy = tot["busy"] if tot else 0.0
        if busy > 0:
            tokens = tot["tokens_dt"] / busy
            alloc = tot["allocated_dt"] / busy
            internal = tot["internal_dt"] / busy
            padding = tot["padding_dt"] / busy
            stranded = tot["stranded_dt"] / busy
            reserved = alloc - tokens - internal - padding
            idle = cap - alloc - stranded
            used = cap - idle
            out.update({
                "kv_token_share": tokens / cap,
                "kv_reserved_share": reserved / cap,
                "kv_internal_frag_share": internal / cap,
                "kv_external_frag_share": (padding + stranded) / cap,
                "kv_free_share": idle / cap,
                "kv_used_token_share": tokens / used if used > 0 else nan,
                "kv_alloc_waste": (alloc - tokens) / alloc if alloc > 0 else nan,
            })
        else:
            for k in ("kv_token_share", "kv_reserved_share", "kv_internal_frag_share",
                      "kv_external_frag_share", "kv_free_share", "kv_used_token_share",
                      "kv_alloc_waste"):
                out[k] = nan
        out["kv_peak_usage"] = self.peak_allocated / cap
        out["num_swap_outs"] = self.num_swap_outs
        out["swapped_bytes"] = self.swapped_bytes
        out["swap_time_s"] = self.swap_time
        return out
