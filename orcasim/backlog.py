"""The backlog of a lazy open-loop source: arrived requests kept as workload indices.

See :class:`Backlog` and :meth:`~orcasim.source.OpenLoopSource.release_lazily`.

Pure data structure: no SimPy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from orcasim.request import Request

if TYPE_CHECKING:
    from orcasim.source import OpenLoopSource


class Backlog:
    """The waiting queue of a lazy source: released requests as a range of workload indices.

    A request that arrived but was not taken yet costs nothing: its
    :class:`~orcasim.request.Request` is made when the policy takes it
    (:meth:`popleft`, first come first served) or looks at it (iteration,
    :meth:`remove`). Requests put back (``appendleft``, a preempted or
    refused one) wait in front of the range; anything appended goes behind
    it, after the range is made into requests, so the order is the order of
    a plain deque fed by :meth:`SchedulerContext.submit`.
    """

    __slots__ = ("_head", "_hi", "_lo", "_source")

    def __init__(self, source: OpenLoopSource) -> None:
        self._source = source
        self._head: deque[Request] = deque()
        self._lo = 0  # first released index not taken yet
        self._hi = 0  # one past the last released index

    def __len__(self) -> int:
        return len(self._head) + self._hi - self._lo

    def __bool__(self) -> bool:
        return self._hi > self._lo or bool(self._head)

    def __iter__(self) -> Iterator[Request]:
        self._materialize()
        return iter(self._head)

    def __reversed__(self) -> Iterator[Request]:
        self._materialize()
        return reversed(self._head)

    def __getitem__(self, i: int) -> Request:
        head = self._head
        if i < 0:
            self._materialize()
        else:
            src = self._source
            while len(head) <= i and self._lo < self._hi:
                k = self._lo
                self._lo = k + 1
                head.append(src._request(k, src._arrival[k]))
        return head[i]

    def release(self, hi: int) -> None:
        """Requests up to index ``hi`` (exclusive) have arrived."""
        self._hi = hi

    def popleft(self) -> Request:
        if self._head:
            return self._head.popleft()
        i = self._lo
        if i >= self._hi:
            raise IndexError("pop from an empty queue")
        self._lo = i + 1
        src = self._source
        return src._request(i, src._arrival[i])

    def appendleft(self, req: Request) -> None:
        self._head.appendleft(req)

    def extendleft(self, reqs: Iterable[Request]) -> None:
        self._head.extendleft(reqs)

    def append(self, req: Request) -> None:
        self._materialize()
        self._head.append(req)

    def extend(self, reqs: Iterable[Request]) -> None:
        self._materialize()
        self._head.extend(reqs)

    def insert(self, i: int, req: Request) -> None:
        self._materialize()
        self._head.insert(i, req)

    def pop(self) -> Request:
        """Remove and return the last request (the latest arrival, made into a request)."""
        self._materialize()
        return self._head.pop()

    def remove(self, req: Request) -> None:
        self._materialize()
        self._head.remove(req)

    def clear(self) -> None:
        self._head.clear()
        self._lo = self._hi

    def _materialize(self) -> None:
        src, head = self._source, self._head
        for i in range(self._lo, self._hi):
            head.append(src._request(i, src._arrival[i]))
        self._lo = self._hi
