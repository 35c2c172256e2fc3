"""Waiting queues with an order of their own, to replace the context's FCFS deque.

A policy that serves requests in another order than arrival installs one of
these as ``ctx.waiting`` in its constructor. Each offers the deque methods
the rest of the simulator uses (``append``, ``appendleft``, ``popleft``,
``remove``, ``clear``, ``len``, iteration), so admission control, drain and
hard stop work with any policy.

- :class:`KeyedQueue`: a heap on a per-request key computed once, when the
  request is queued (priority level, deadline, predicted length...). Ties go
  first come, first served. O(log n) per operation.
- :class:`~orcasim.policies.grouped.GroupedQueue`: one FIFO per group (class,
  tenant), for policies that first choose a group and then serve it in arrival
  order.

Both take arrivals from a lazy source at step boundaries (:class:`Released`).

Pure data structures: no SimPy.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from orcasim.request import Request


class Released:
    """A queue into which a lazy open-loop source releases its arrivals at step boundaries.

    The source's requests are queued with ``append``, in arrival order, when
    the source says they arrived (:meth:`release`), as if each had been
    appended at its arrival (see
    :meth:`~orcasim.source.OpenLoopSource.release_lazily`).
    """

    __slots__ = ("_backlog",)

    #: a lazy source may release arrivals into it (:meth:`release`)
    takes_releases = True

    def __init__(self) -> None:
        self._backlog: Any = None

    def append(self, req: Request) -> None:
        raise NotImplementedError

    def attach(self, backlog: Any) -> Released:
        """Take the arrivals of a lazy source's ``backlog`` (a
        :class:`~orcasim.backlog.Backlog`) as :meth:`release` says they came; return itself
        (what the source releases into)."""
        self._backlog = backlog
        return self

    def release(self, hi: int) -> None:
        """The source's requests up to ``hi`` (exclusive) arrived: queue them, in arrival
        order, as if each had been appended when it came."""
        backlog = self._backlog
        backlog.release(hi)
        if backlog:
            append = self.append
            for req in backlog:  # (made into requests in order; appending does not touch it)
                append(req)
            backlog.clear()


class KeyedQueue(Released):
    """Requests ordered by ``key(request)`` (smallest first), FIFO among equal keys.

    The key is computed when a request is queued and does not change while it
    waits. Removal from the middle is lazy (the entry is skipped when it
    reaches the top), so every operation is O(log n).

    An entry is ``(key, number, request)``; with ``width`` (every key a tuple
    of that many items) it is the key's items followed by the number and the
    request, which orders the same and compares faster (one flat tuple).
    :meth:`entry_key` gives an entry's key either way.

    With ``index_keys`` (``source -> (index -> key)`` or ``None``, the key of
    a lazy source's request from its workload row, equal to ``key`` of the
    request with the same effects), the arrivals a lazy source releases are
    queued as workload indices: a request is made only when it reaches the
    head (or the queue is iterated), so one that waits costs its entry alone.
    """

    __slots__ = ("_arrival", "_heap", "_index_keys", "_key", "_lazy", "_live", "_make", "_of_row",
                 "_seq", "_top", "_width", "popped")

    def __init__(self, key: Callable[[Request], Any], width: int = 0,
                 index_keys: Callable[[Any], Callable[[int], Any] | None] | None = None) -> None:
        super().__init__()
        self._key = key
        self._width = width
        self._index_keys = index_keys
        self._of_row: Callable[[int], Any] | None = None  # a row's key (a lazy source's)
        self._make: Callable[[int, float], Request] | None = None  # a row's request
        self._arrival: Any = None  # (and the arrival time it is made with)
        self._lazy = 0  # entries that hold a workload index (all live)
        self._heap: list[tuple[Any, ...]] = []
        self._live: dict[int, int] = {}  # id(request) -> seq of its live entry
        self._seq = 0
        #: the first live entry, which is the heap's first (None: not known)
        self._top: tuple[Any, ...] | None = None
        #: the entry :meth:`popleft` took last (its key, for a policy that ranks by it)
        self.popped: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return len(self._live) + self._lazy

    def __bool__(self) -> bool:
        return bool(self._live) or self._lazy > 0

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in queue order."""
        if self._lazy:
            heap = self._heap
            for at, entry in enumerate(heap):
                if type(entry[-1]) is int:
                    heap[at] = self._made(entry)
        live = self._live
        return iter([e[-1] for e in sorted(self._heap) if live.get(id(e[-1])) == e[-2]])

    def attach(self, backlog: Any) -> Released:
        """:meth:`Released.attach`; with ``index_keys``, its releases are queued as indices."""
        super().attach(backlog)
        src = backlog._source
        of_row = self._index_keys(src) if self._index_keys is not None else None
        if of_row is not None:
            self._of_row = of_row
            self._make, self._arrival = src._request, src._arrival
        return self

    def _made(self, entry: tuple[Any, ...]) -> tuple[Any, ...]:
        """``entry`` of a workload index, with the index made into its request (now live)."""
        i = entry[-1]
        req = self._make(i, self._arrival[i])  # type: ignore[misc]
        self._live[id(req)] = entry[-2]
        self._lazy -= 1
        return (*entry[:-1], req)

    def entry_key(self, entry: tuple[Any, ...]) -> Any:
        """The key of ``entry`` (one of :meth:`top`, :attr:`popped`)."""
        w = self._width
        return entry[:w] if w else entry[0]

    def _entry(self, req: Request, seq: int) -> tuple[Any, ...]:
        k = self._key(req)
        if not self._width:
            return (k, seq, req)
        if type(k) is not tuple or len(k) != self._width:
            raise TypeError(f"key {k!r} of request {req.label} is not a tuple of "
                            f"{self._width} items")
        return (*k, seq, req)

    def append(self, req: Request) -> None:
        """Queue ``req`` at the place its key gives it."""
        seq = self._seq
        self._seq = seq + 1
        self._live[id(req)] = seq
        entry = self._entry(req, seq)
        heapq.heappush(self._heap, entry)
        top = self._top
        if top is not None and entry < top:
            self._top = None

    appendleft = append  # a preempted request also goes where its key puts it

    def release(self, hi: int) -> None:
        """:meth:`Released.release`, each arrival keyed and pushed in one pass."""
        backlog = self._backlog
        backlog.release(hi)
        if not backlog:
            return
        of_row = self._of_row
        if of_row is not None and not backlog._head:  # as indices (see the class)
            self._release_rows(backlog, of_row)
            return
        live, heap, push = self._live, self._heap, heapq.heappush
        make = self._entry
        seq = self._seq
        top = self._top
        for req in backlog:  # in arrival order, as :meth:`append` one by one
            live[id(req)] = seq
            entry = make(req, seq)
            push(heap, entry)
            if top is not None and entry < top:
                top = None
            seq += 1
        self._seq = seq
        self._top = top
        backlog.clear()

    def _release_rows(self, backlog: Any, of_row: Callable[[int], Any]) -> None:
        """The backlog's released rows queued as workload indices, in arrival order."""
        heap, push, w = self._heap, heapq.heappush, self._width
        lo, hi = backlog._lo, backlog._hi
        backlog._lo = hi
        seq = self._seq
        top = self._top
        for i in range(lo, hi):
            k = of_row(i)
            entry = (*k, seq, i) if w else (k, seq, i)
            push(heap, entry)
            if top is not None and entry < top:
                top = None
            seq += 1
        self._lazy += hi - lo
        self._seq = seq
        self._top = top

    def top(self) -> tuple[Any, ...]:
        """The first entry: ``(key, number, request)``, or with ``width`` the key's items,
        the number and the request (IndexError if empty)."""
        top = self._top
        if top is not None:
            return top
        heap, live = self._heap, self._live
        while heap:
            entry = heap[0]
            x = entry[-1]
            if type(x) is int:  # a workload index: its request now (as _made)
                req = self._make(x, self._arrival[x])  # type: ignore[misc]
                live[id(req)] = entry[-2]
                self._lazy -= 1
                entry = heap[0] = self._top = (*entry[:-1], req)
                return entry
            if live.get(id(x)) == entry[-2]:
                self._top = entry
                return entry
            heapq.heappop(heap)
        raise IndexError("the queue is empty")

    def peek(self) -> Request:
        """The first request, without removing it (IndexError if empty)."""
        return self.top()[-1]  # type: ignore[no-any-return]

    def __getitem__(self, i: int) -> Request:
        """``queue[0]`` is the first request, as for a deque; other indices are not supported."""
        top = self._top
        if top is not None and i == 0:
            return top[-1]  # type: ignore[no-any-return]
        if i != 0:
            raise IndexError("only queue[0] (the head) is supported")
        return self.top()[-1]  # type: ignore[no-any-return]

    def peek_key(self) -> Any:
        """The key of the first request (IndexError if empty)."""
        return self.entry_key(self.top())

    def popleft(self) -> Request:
        """Remove and return the first request (IndexError if empty)."""
        entry = self._top
        if entry is None:
            entry = self.top()
        self.popped = entry
        req = entry[-1]
        heapq.heappop(self._heap)
        del self._live[id(req)]
        self._top = None
        return req  # type: ignore[no-any-return]

    def remove(self, req: Request) -> None:
        """Take ``req`` out of the queue (ValueError if it is not queued)."""
        if self._live.pop(id(req), None) is None:
            raise ValueError(f"request {req.label} is not queued")
        top = self._top
        if top is not None and top[-1] is req:
            self._top = None

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()
        self._lazy = 0
        self._top = None
