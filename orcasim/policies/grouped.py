"""``GroupedQueue``: a waiting queue of one first-come-first-served queue per group.

For policies that first choose a group (class, tenant) and then serve it in
arrival order (see :mod:`orcasim.policies.fair`); it offers the deque methods
of every waiting queue (see :mod:`orcasim.policies.queues`).

Pure data structure: no SimPy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from itertools import repeat
from typing import Any

from orcasim.policies.queues import Released
from orcasim.request import Request


class GroupedQueue(Released):
    """One first-come-first-served queue per group (``group(request)``: class, tenant...).

    ``queue[0]`` and ``popleft()`` serve the group chosen by ``choose(groups)``
    (which must not change anything), called with the groups that have waiting
    requests in the order they first appeared. ``on_backlog(group, request)`` is
    called when a new arrival finds its group's queue empty (before it is queued).
    The choice is kept until the backlogged groups change, or the owner of what
    ``choose`` reads says it changed (:meth:`forget_choice`).

    With ``group_column`` (a request attribute whose workload column, if any,
    holds the group), the arrivals a lazy source releases are queued as
    workload indices, each made into its request when it reaches the head of
    its group (or is handed to ``on_backlog``, or the queue is iterated).
    """

    __slots__ = ("_arrival", "_choose", "_chosen", "_column", "_group", "_make", "_n",
                 "_of_row", "_on_backlog", "queues")

    def __init__(
        self,
        group: Callable[[Request], Hashable],
        choose: Callable[[list[Hashable]], Hashable] | None = None,
        on_backlog: Callable[[Hashable, Request], None] | None = None,
        group_column: str | None = None,
    ) -> None:
        super().__init__()
        self._group = group
        self._choose = choose
        self._on_backlog = on_backlog
        self._column = group_column
        self._of_row: Any = None  # a lazy source's column of groups ([None]: no column)
        #: a row's request (``_make(i, _arrival[i])``: the lazy source's own maker)
        self._make: Callable[[int, float], Request] | None = None
        self._arrival: Any = None
        self.queues: dict[Hashable, deque[Request]] = {}
        self._n = 0
        self._chosen: list[Hashable] = []  # the group served next, when known

    def attach(self, backlog: Any) -> Released:
        """:meth:`Released.attach`; with ``group_column``, its releases are queued as
        indices."""
        super().attach(backlog)
        if self._column is not None:
            src = backlog._source
            col = dict(src._attrs).get(self._column)
            self._of_row = col if col is not None else repeat(None)
            self._make, self._arrival = src._request, src._arrival
        return self

    def release(self, hi: int) -> None:
        """:meth:`Released.release`, as workload indices with ``group_column``."""
        backlog = self._backlog
        of_row = self._of_row
        if of_row is None or backlog._head:
            super().release(hi)
            return
        backlog.release(hi)
        lo = backlog._lo
        backlog._lo = hi
        queues = self.queues
        fixed = None if type(of_row) is repeat else of_row
        self._n += hi - lo
        if fixed is None and lo < hi:  # every one in group None: a backlogged group's queue
            q = queues.get(None)  # takes the rest at once (append one by one, as below)
            if q is None:
                q = queues[None] = deque()
            if not q:
                self._first(q, None, lo)
                lo += 1
            q.extend(range(lo, hi))  # type: ignore[arg-type]
            return
        for i in range(lo, hi):  # in arrival order, as append one by one
            g = fixed[i] if fixed is not None else None
            q = queues.get(g)
            if q is None:
                q = queues[g] = deque()
            if q:
                q.append(i)  # type: ignore[arg-type]
            else:
                self._first(q, g, i)

    def _first(self, q: deque[Request], g: Hashable, i: int) -> None:
        """Row ``i`` joins group ``g``'s empty queue ``q``: the choice of group is forgotten,
        and ``on_backlog``, if any, sees it as a request (then queued as one)."""
        self._chosen = []
        on_backlog = self._on_backlog
        if on_backlog is not None:
            req = self._make(i, self._arrival[i])  # type: ignore[misc]
            on_backlog(g, req)
            q.append(req)
        else:
            q.append(i)  # type: ignore[arg-type]

    def _head(self, q: deque[Request]) -> Request:
        """The first request of group queue ``q``, made from its index if need be."""
        req = q[0]
        if type(req) is int:
            req = q[0] = self._make(req, self._arrival[req])  # type: ignore[misc]
        return req

    def forget_choice(self) -> None:
        """What ``choose`` reads changed: choose again when asked."""
        self._chosen = []

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Request]:
        """Waiting requests, group by group."""
        for q in self.queues.values():
            for at, req in enumerate(q):
                if type(req) is int:
                    q[at] = self._make(req, self._arrival[req])  # type: ignore[misc]
            yield from q

    def group(self, req: Request) -> Hashable:
        return self._group(req)

    def backlogged(self) -> list[Hashable]:
        """Groups with waiting requests."""
        return [g for g, q in self.queues.items() if q]

    def append(self, req: Request) -> None:
        g = self._group(req)
        q = self.queues.get(g)
        if q is None:
            q = self.queues[g] = deque()
        if not q:
            self._chosen = []
            if self._on_backlog is not None:
                self._on_backlog(g, req)
        q.append(req)
        self._n += 1

    def appendleft(self, req: Request) -> None:
        """Put ``req`` back at the head of its group (a preempted request)."""
        g = self._group(req)
        q = self.queues.setdefault(g, deque())
        if not q:
            self._chosen = []
        q.appendleft(req)
        self._n += 1

    def peek_group(self, g: Hashable) -> Request:
        return self._head(self.queues[g])

    def pop_group(self, g: Hashable) -> Request:
        """Remove and return the first request of group ``g``."""
        q = self.queues[g]
        req = q.popleft()
        if type(req) is int:
            req = self._make(req, self._arrival[req])  # type: ignore[misc]
        self._n -= 1
        if not q:
            self._chosen = []
        return req

    def next_group(self) -> Hashable:
        """The group served next (IndexError if every queue is empty)."""
        chosen = self._chosen
        if chosen:
            return chosen[0]
        groups = self.backlogged()
        if not groups:
            raise IndexError("the queue is empty")
        g = self._choose(groups) if self._choose is not None else groups[0]
        self._chosen = [g]
        return g

    def __getitem__(self, i: int) -> Request:
        """``queue[0]``: the request ``popleft()`` would return."""
        if i != 0:
            raise IndexError("only queue[0] (the head) is supported")
        chosen = self._chosen
        return self._head(self.queues[chosen[0] if chosen else self.next_group()])

    def popleft(self) -> Request:
        """Serve the group ``choose`` picks (default: the first backlogged one)."""
        chosen = self._chosen
        return self.pop_group(chosen[0] if chosen else self.next_group())

    def remove(self, req: Request) -> None:
        q = self.queues.get(self._group(req))
        if q is None or req not in q:
            raise ValueError(f"request {req.label} is not queued")
        q.remove(req)
        self._n -= 1
        if not q:
            self._chosen = []

    def clear(self) -> None:
        self.queues.clear()
        self._n = 0
        self._chosen = []
