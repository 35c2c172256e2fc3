"""``KeyedPolicy``: a :class:`~orcasim.policies.common.BatchPolicy` ordered by a key.

The waiting queue is a :class:`~orcasim.policies.queues.KeyedQueue` on the
policy's :meth:`~KeyedPolicy.key`; running requests get tokens in key order,
and a preemptive policy gives up its largest-key request for a smaller-key
head. ``priority``, ``sjf``, ``edf`` and ``srpt`` build on it (see
:mod:`orcasim.policies.keys` for the keys' caches and predictors).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from heapq import heappop
from typing import Any, ClassVar

from orcasim.context import SchedulerContext
from orcasim.params import ComponentParams
from orcasim.policies.base import TokenPolicy
from orcasim.policies.common import ONE, BatchPolicy, unschedule
from orcasim.policies.keys import KeyCache
from orcasim.policies.queues import KeyedQueue
from orcasim.request import Request, RequestState

RUNNING = RequestState.RUNNING
#: ``SchedulerContext.admit`` as defined (one replaced later is called, not done inline)
PLAIN_ADMIT = SchedulerContext.admit


class KeyedPolicy(BatchPolicy):
    """A :class:`BatchPolicy` that serves waiting requests by :meth:`key` (smallest first).

    Running requests also get tokens in key order. With ``preempt: true`` in
    the parameters, a full batch gives up its largest-key request (the latest
    admitted among ties) whenever the head of the queue has a strictly smaller
    key.
    """

    #: whether a request's key never changes (then a running request's key is computed once)
    static_keys: ClassVar[bool] = True
    #: if every key is a tuple of this many items: the waiting queue's entries are flat (see
    #: :class:`~orcasim.policies.queues.KeyedQueue`); 0: keys of any kind
    key_width: ClassVar[int] = 0
    #: off: :meth:`admit_waiting` takes the general steps of :class:`BatchPolicy`
    lean_admission: ClassVar[bool] = True
    #: what :meth:`admit_waiting` may do inline (see :meth:`_lean_flags`; found at its first call)
    _lean: tuple[bool, ...] | None = None
    #: whether :meth:`order` and ``order_running`` are as defined here (found at the first
    #: :meth:`decode_entries`)
    _plain_order: bool | None = None
    #: when the kept running order was last sorted (keys that change: see ``victim_rule``)
    _sorted_at: float = -1.0

    def __init__(self, params: ComponentParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.preemptive = bool(getattr(params, "preempt", False))
        if ctx is not None:
            ctx.waiting = KeyedQueue(self.key, *self._key_form())
        self._keys = KeyCache(self.key)
        #: the key of a running request now: :meth:`key`, or its cached value for static keys
        self.rank = self._keys.__getitem__ if self.static_keys else self.key
        #: the running requests in key order (ties in admission order), kept as they are
        #: admitted and leave: with static keys and no memory limit (no swapping)
        self._ordered: list[Request] | None = (
            [] if self.static_keys and self.mem is None else None)
        #: ``(request, 1)`` for each of ``_entries_of`` (the running order it mirrors), in
        #: that order: a decode step's entries (see :meth:`decode_entries`)
        self._entries: list[tuple[Request, int]] | None = None
        self._entries_of: list[Request] | None = None
        #: whether the hook below :meth:`admitted` is the plain one (which does nothing)
        self._plain_admitted = (getattr(super().admitted, "__func__", None)
                                is BatchPolicy.admitted)
        #: what else :meth:`release` does with a request that leaves (a subclass's caches)
        self._forget: Callable[[Request], None] | None = None
        #: whether a request's rank as it is admitted is its key as it was queued (static
        #: keys; a policy whose keys change says so where they do not yet differ)
        self._rank_is_key = self.static_keys
        #: whether the release below :meth:`release` is the plain one (memory, if limited)
        self._plain_release = (getattr(super().release, "__func__", None)
                               is TokenPolicy.release)

    def key(self, req: Request) -> Any:
        """Sort key of ``req`` (smaller runs first); computed when it is queued."""
        raise NotImplementedError

    def index_key(self, source: Any) -> Callable[[int], Any] | None:
        """The key of a lazy open-loop ``source``'s request from its workload index: the same
        value as :meth:`key` with the same effects (``None``: only from requests)."""
        return None

    def _key_form(self) -> tuple[int, Callable[[Any], Callable[[int], Any] | None] | None]:
        """:attr:`key_width` and :meth:`index_key`, as the class that defines the :meth:`key`
        in use declares them (a subclass with a key of its own does not inherit them)."""
        for cls in type(self).__mro__:
            if "key" in cls.__dict__:
                return (int(cls.__dict__.get("key_width", 0)),
                        self.index_key if "index_key" in cls.__dict__ else None)
        return 0, None

    def pool_safe(self) -> bool:
        return self.static_keys  # a running request's rank is its key, computed once

    def order(self, reqs: list[Request]) -> Iterable[Request]:
        ordered = self._ordered
        if ordered is not None and reqs is self.running and len(ordered) == len(reqs):
            return ordered
        return sorted(reqs, key=self.rank)

    def victim(self, head: Request) -> Request | None:
        if not self.running:
            return None
        worst = self.memory_victim()
        waiting = self.ctx.waiting
        if type(waiting) is KeyedQueue and waiting:  # the head's key, as it was queued
            entry = waiting.top()
            key = waiting.entry_key(entry) if entry[-1] is head else self.key(head)
        else:
            key = self.key(head)
        return worst if key < self.rank(worst) else None

    victim_rule: ClassVar[str] = "kept"  # (memory_victim: the kept order's last; see _lean_flags)

    def memory_victim(self) -> Request:
        """The running request with the largest key (the latest admitted among ties)."""
        ordered = self._ordered
        if ordered is not None and len(ordered) == len(self.running):
            return ordered[-1]
        return max(reversed(self.running), key=self.rank)

    def admitted(self, req: Request) -> None:
        super().admitted(req)
        if self.static_keys:  # its key, as it was queued (a static key does not change)
            waiting = self.ctx.waiting
            popped = getattr(waiting, "popped", None)
            if popped is not None and popped[-1] is req:
                self._keys[req] = waiting.entry_key(popped)
        ordered = self._ordered
        if ordered is not None:
            self._place(req, self.rank(req))

    def _place(self, req: Request, x: Any) -> None:
        """Put just admitted ``req``, of rank ``x``, into the kept running order (and its
        entries): after its equals (insort_right), in one look if it is last."""
        ordered = self._ordered
        if ordered is not None:
            rank = self.rank
            entries = self._entries if self._entries_of is ordered else None
            if entries is not None and len(entries) != len(ordered):
                entries = self._entries = None
            if not ordered or not x < rank(ordered[-1]):
                ordered.append(req)
                if entries is not None:
                    entries.append((req, 1))
            else:
                at = bisect.bisect_right(ordered, x, key=rank)
                ordered.insert(at, req)
                if entries is not None:
                    entries.insert(at, (req, 1))

    def admit_waiting(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        """:meth:`BatchPolicy.admit_waiting` from a :class:`KeyedQueue` without memory
        limits, the same steps with the queue's entries at hand: the head's key (for the
        victim and the running order) is its entry's."""
        ctx = self.ctx
        waiting = ctx.waiting
        lean = self._lean
        if lean is None:
            lean = self._lean_flags()
        if not lean or type(waiting) is not KeyedQueue:  # (a memory limit, or switched off)
            return super().admit_waiting(scheduled, budget)
        slots = ctx.slots
        preemptive = self.preemptive
        if budget <= 0 or (slots.count >= slots.capacity and not preemptive):
            return budget  # (as an empty queue: the loop below admits nothing)
        live = waiting._live
        if not live and not waiting._lazy:
            return budget
        own_victim, kept, by_sort, own_admitted, key_rank, static, plain_admit = lean
        # ctx.admit inline: a free slot (the batch is not full where one is admitted), no
        # reserved slots, and nothing to call or wake
        direct = (plain_admit and not slots.reserved and ctx.on_admit is None
                  and ctx._admitted is None)
        if direct:
            start = ctx.env._now
            if ctx.busy_until > start:
                start = ctx.busy_until
        rank = self.rank
        running = self.running
        ordered = self._ordered
        w = waiting._width
        heap = waiting._heap
        #: the request last in the kept order and its rank, as this boundary found them
        last: tuple[Request, Any] | None = None
        while budget > 0 and (live or waiting._lazy):
            full = slots.count >= slots.capacity
            if full and not preemptive:
                break
            # (the queue's top and popleft, inline: its heap, live entries and cached top)
            entry = waiting._top
            fresh = False  # whether the head is a workload index (live), made its request below
            if entry is None:  # (waiting.top(), when the heap's first is live)
                entry = heap[0]
                x = entry[-1]
                if type(x) is int:
                    fresh = True
                elif live.get(id(x)) == entry[-2]:
                    waiting._top = entry
                else:
                    entry = waiting.top()
            if full:
                if own_victim:  # (KeyedPolicy.victim, with the head's key from its entry)
                    if not running:
                        break
                    if (kept and ordered is not None and len(ordered) == len(running)
                            and (not by_sort or self._sorted_at == ctx.env._now)):
                        victim = ordered[-1]  # (memory_victim: the kept order's last)
                    else:
                        victim = self.memory_victim()
                    worst = last[1] if last is not None and last[0] is victim else rank(victim)
                    if not (entry[:w] if w else entry[0]) < worst:
                        break  # (a head still a workload index stays one)
                else:
                    if fresh:
                        entry = waiting.top()  # (its request, a live entry at the head)
                    victim = self.victim(entry[-1])
                    if victim is None:
                        break
                budget += unschedule(scheduled, victim)
                self.preempt(victim, "priority")
                if direct and (slots.reserved or ctx.on_admit is not None
                               or ctx._admitted is not None):
                    direct = False  # (its slot went to a request waiting for one)
                ordered = self._ordered
                last = None
                continue
            if fresh:  # a workload index: its request now
                head = waiting._make(x, waiting._arrival[x])
                if not own_admitted or (
                        (need := (head.prompt_len or 1) + head.num_output_tokens
                         - head.num_computed_tokens) > budget and not self.chunked):
                    live[id(head)] = entry[-2]  # (it stays at the head: a live entry)
                    waiting._lazy -= 1
                    entry = heap[0] = waiting._top = (*entry[:-1], head)
                    fresh = False
                # (else: popped below at once, never live, its entry left as it is)
            if fresh:  # (waiting.popleft, of an index made its request above)
                if need > budget:
                    need = budget  # (chunked)
                waiting.popped = None  # (own_admitted: nothing reads it)
                heappop(heap)
                waiting._lazy -= 1
            else:
                head = entry[-1]
                need = (head.prompt_len or 1) + head.num_output_tokens - head.num_computed_tokens
                if need > budget:
                    if self.chunked:
                        need = budget
                    elif scheduled:
                        break  # head-of-line: it waits for a step with room
                    elif head.num_output_tokens == 0 and need > self.params.token_budget:
                        waiting.popleft()
                        ctx.reject(head, "prompt_too_long")
                        continue
                waiting.popped = entry  # (waiting.popleft: the top is the heap's first)
                heappop(heap)
                del live[id(head)]
                waiting._top = None
            if direct:  # (ctx.admit)
                if head.state != RUNNING:
                    slots.count += 1
                head.state = RUNNING
                if head.first_scheduled is None:
                    head.first_scheduled = start
                    ctx.num_started += 1
            else:
                ctx.admit(head)
            running.append(head)
            self.decoding = None  # the batch changed
            scheduled.append((head, need))
            budget -= need
            if own_admitted:  # (admitted: the key as it was queued)
                if static:
                    x = self._keys[head] = entry[:w] if w else entry[0]
                elif ordered is not None:  # (its rank now: its key, or asked for)
                    x = (entry[:w] if w else entry[0]) if key_rank else rank(head)
                if ordered is not None:  # (_place, in one look when it goes last)
                    if ordered and x < (lx := rank(ordered[-1])):
                        last = (ordered[-1], lx)
                        self._place(head, x)
                    else:
                        last = (head, x)
                        entries = self._entries
                        if entries is not None and self._entries_of is ordered:
                            if len(entries) == len(ordered):
                                entries.append((head, 1))
                            else:
                                self._entries = None
                        ordered.append(head)
            else:
                self.admitted(head)
                ordered = self._ordered
                last = None
        return budget

    def _lean_flags(self) -> tuple[bool, ...]:
        """What :meth:`admit_waiting` may do inline for this policy, found at its first call:
        ``()`` for nothing (a memory limit, or :attr:`lean_admission` off), else the victim
        (:meth:`victim` as defined), the kept order's last as the memory victim
        (``victim_rule`` of the class that defines :meth:`memory_victim`: ``"kept"``, or
        ``"sorted"``: at the boundary where the order was last sorted), the admission hook
        (:meth:`admitted` as defined), whether an admitted request's rank is its key as it
        was queued (:attr:`_rank_is_key`), :attr:`static_keys`, and whether ``ctx.admit`` is
        :meth:`SchedulerContext.admit` (then inline where nothing waits on an admission)."""
        if self.mem is not None or not self.lean_admission:
            self._lean = ()
            return ()
        kind = type(self)
        rule = next(c.__dict__.get("victim_rule") for c in kind.__mro__
                    if "memory_victim" in c.__dict__)
        self._lean = (kind.victim is KeyedPolicy.victim, rule is not None, rule == "sorted",
                      kind.admitted is KeyedPolicy.admitted and self._plain_admitted,
                      self.static_keys or self._rank_is_key, self.static_keys,
                      getattr(self.ctx.admit, "__func__", None) is PLAIN_ADMIT)
        return self._lean

    def release(self, req: Request) -> None:
        if self._plain_release:  # (TokenPolicy.release: memory, if limited)
            if self.mem is not None:  # (no memory limit without it)
                kv = self.ctx.kv
                if kv.limited and kv.holds(req):
                    kv.release(req)
        else:
            super().release(req)
        ordered = self._ordered
        # (absent if a subclass's admitted() skipped ours: then order() does not use it)
        if ordered is not None:
            try:
                at = ordered.index(req)
            except ValueError:  # (not in it)
                at = -1
            if at >= 0:
                del ordered[at]
                entries = self._entries
                if entries is not None and self._entries_of is ordered:
                    if len(entries) == len(ordered) + 1:
                        del entries[at]
                    else:
                        self._entries = None
        keys = self._keys
        if keys:  # (empty for keys that change and a rank without a cache: srpt's)
            keys.pop(req, None)
        forget = self._forget
        if forget is not None:
            forget(req)

    def decode_entries(self) -> list[tuple[Request, int]]:
        """:meth:`BatchPolicy.decode_entries`, from a copy of ``(request, 1)`` pairs kept in
        the order of the running requests as they are admitted and leave."""
        plain = self._plain_order
        if plain is None:  # (this class's order, as defined: found at the first call)
            kind = type(self)
            plain = self._plain_order = (kind.order is KeyedPolicy.order
                                         and kind.order_running is BatchPolicy.order_running)
        ordered, entries = self._ordered, self._entries
        if (plain and ordered is not None and entries is not None and self._entries_of is ordered
                and len(entries) == len(ordered) == len(self.running)):
            return entries.copy()  # (order: the kept order, whose entries are kept)
        ordered = (self.order(self.running) if type(self).order_running
                   is BatchPolicy.order_running else self.order_running())
        entries = self._entries
        if (ordered is self._ordered and entries is not None and self._entries_of is ordered
                and len(entries) == len(ordered)):
            return entries.copy()
        fresh = list(zip(ordered, ONE, strict=False))
        if ordered is self._ordered:  # kept from here on
            self._entries, self._entries_of = fresh, ordered
            return fresh.copy()
        return fresh

    def swap_first(self, swapped: Request, head: Request) -> bool:
        """A swapped-out request comes back before ``head`` unless ``head`` has a smaller key."""
        return not self.key(head) < self.key(swapped)

    def preempt(self, req: Request, reason: str = "priority") -> None:
        super().preempt(req, reason)
        mem = self.mem
        if mem is not None and mem.swapped and mem.swapped[-1] is req:
            mem.swapped.pop()  # keep the swapped requests in key order
            keys = [self.key(r) for r in mem.swapped]
            mem.swapped.insert(bisect.bisect_right(keys, self.key(req)), req)
