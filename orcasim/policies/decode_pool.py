"""Running requests that decode one token a step, advanced together without touching each.

After a run of steps in which every running request decodes (see
:mod:`orcasim.policies.runs`), a token-level policy puts its running
requests in a :class:`DecodePool`: the pool counts the decode steps its
members took together, and each member's counters (``num_computed_tokens``,
``num_output_tokens``, ``last_token``) are brought up to date only when
something reads them (it leaves, finishes, is preempted or listed), as
:class:`~orcasim.batch.DecodeBatch` does for decode-only policies. A run's
end thus costs O(1) plus O(log B) per request that finishes or joins,
instead of a pass over the batch.

While a member is in the pool its fields show it as it joined: a request
that had just emitted a token (``num_computed_tokens == num_tokens - 1``),
so the step rule sees it as a decode either way. Its true counters are the
stored ones plus the steps the pool took since it joined, and its last
token came at the end of the pool's latest step (:attr:`DecodePool.last`).

Pure data structure: no SimPy.
"""

from __future__ import annotations

import heapq
from itertools import repeat

from orcasim.request import Request

Entry = tuple[Request, int]  # a scheduled request and its tokens


class DecodePool:
    """Members decoding together: step count, KV tokens, and the next finish in a heap.

    ``kv`` is the members' computed tokens in all (what a step of theirs
    reads); ``steps`` the decode steps the pool took; ``last`` the end of the
    latest one, which is every member's last token time.
    """

    __slots__ = ("_heap", "_seq", "entries", "kv", "last", "members", "reqs", "size", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.kv = 0
        self.size = 0
        self.last: float | None = None
        #: member -> (pool steps when its fields were last written, its heap entry's number)
        self.members: dict[Request, tuple[int, int]] = {}
        #: ``(member, 1)`` for each member in the order they joined: a step's decode entries
        self.entries: list[tuple[Request, int]] = []
        #: the members in the same order (found by identity: the index of an entry)
        self.reqs: list[Request] = []
        #: (pool step at which the member emits its last token, number, member); stale entries
        #: (a member that left) are skipped when they reach the top
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = 0

    def __contains__(self, req: Request) -> bool:
        return req in self.members

    def join(self, req: Request) -> None:
        """Add ``req``, whose counters are up to date and whose last token came at ``last``."""
        seq = self._seq
        self._seq = seq + 1
        self.members[req] = (self.steps, seq)
        heapq.heappush(self._heap, (self.steps + req.output_len - req.num_output_tokens, seq,
                                    req))
        self.entries.append((req, 1))
        self.reqs.append(req)
        self.kv += req.num_computed_tokens
        self.size += 1

    def join_all(self, reqs: list[Request]) -> None:
        """:meth:`join` each of ``reqs``."""
        members, heap, steps = self.members, self._heap, self.steps
        seq = self._seq
        if len(reqs) == 1:  # (the usual case: one joins as one leaves)
            req = reqs[0]
            members[req] = (steps, seq)
            heapq.heappush(heap, (steps + req.output_len - req.num_output_tokens, seq, req))
            self.kv += req.num_computed_tokens
            self._seq = seq + 1
            self.size += 1
            self.entries.append((req, 1))
            self.reqs.append(req)
            return
        kv = self.kv
        for req in reqs:
            members[req] = (steps, seq)
            heapq.heappush(heap, (steps + req.output_len - req.num_output_tokens, seq, req))
            kv += req.num_computed_tokens
            seq += 1
        self.kv = kv
        self._seq = seq
        self.size += len(reqs)
        self.entries += zip(reqs, repeat(1))
        self.reqs += reqs

    def advance(self, k: int, t_end: float) -> list[Request]:
        """Every member decodes ``k`` tokens, the last in a step ending at ``t_end``; take out
        (up to date) and return those that emitted their last token in that step (:meth:`due`)."""
        return self.end_run(k, t_end, [])[0]

    def end_run(self, k: int, t_end: float, joining: list[Request]) -> tuple[list[Request], int]:
        """A run's end in one call: every member decodes ``k`` tokens, the last in a step
        ending at ``t_end``, and those that emitted their last token in that step are taken out
        (up to date); then ``joining`` join as :meth:`join_all` does. Returns the members taken
        out and :meth:`first_finish` after the joins (:meth:`advance` and :meth:`due` are this
        with nobody joining)."""
        steps = self.steps + k
        self.steps = steps
        kv = self.kv + self.size * k
        self.last = t_end
        heap, base = self._heap, self.members
        out: list[Request] = []
        if heap and heap[0][0] <= steps:
            entries, order = self.entries, self.reqs
            pop = heapq.heappop
            while heap and heap[0][0] <= steps:
                done, seq, req = pop(heap)
                b = base.get(req)
                if b is None or b[1] != seq:
                    continue
                if done != steps:
                    raise ValueError(f"request {req.label} finished {steps - done} steps ago")
                del base[req]
                d = steps - b[0]
                if d:
                    req.num_computed_tokens += d
                    req.num_output_tokens += d
                    req.last_token = t_end
                kv -= req.num_computed_tokens
                at = order.index(req)
                del order[at]
                del entries[at]
                out.append(req)
            self.size -= len(out)
        if joining:  # (join_all)
            seq = self._seq
            push = heapq.heappush
            for req in joining:
                base[req] = (steps, seq)
                push(heap, (steps + req.output_len - req.num_output_tokens, seq, req))
                kv += req.num_computed_tokens
                seq += 1
            self._seq = seq
            self.size += len(joining)
            if len(joining) == 1:
                req = joining[0]
                self.entries.append((req, 1))
                self.reqs.append(req)
            else:
                self.entries += zip(joining, repeat(1))
                self.reqs += joining
        self.kv = kv
        while heap:  # (first_finish)
            done, seq, req = heap[0]
            b = base.get(req)
            if b is not None and b[1] == seq:
                return out, done - steps
            heapq.heappop(heap)
        return out, 1 << 62

    def context(self, req: Request) -> int:
        """``req``'s computed tokens now (a member or not)."""
        b = self.members.get(req)
        return req.num_computed_tokens if b is None else (
            req.num_computed_tokens + self.steps - b[0])

    def members_of(self, scheduled: list[Entry]) -> tuple[int, list[Entry]]:
        """How many of ``scheduled``'s requests are members, and the other entries in order."""
        base = self.members
        rest = [e for e in scheduled if e[0] not in base]
        return len(scheduled) - len(rest), rest

    def output_tokens(self, req: Request) -> int:
        """``req``'s generated tokens now (a member or not)."""
        b = self.members.get(req)
        return req.num_output_tokens if b is None else (
            req.num_output_tokens + self.steps - b[0])

    def first_finish(self) -> int:
        """Decode steps until the first member emits its last token (the next step is 1)."""
        heap, base, steps = self._heap, self.members, self.steps
        while heap:
            done, seq, req = heap[0]
            b = base.get(req)
            if b is not None and b[1] == seq:
                return done - steps
            heapq.heappop(heap)
        return 1 << 62

    def due(self) -> list[Request]:
        """Take out the members that emitted their last token in the latest step, up to date."""
        return self.end_run(0, self.last, [])[0]

    def _write(self, req: Request, since: int) -> None:
        d = self.steps - since
        if d:
            req.num_computed_tokens += d
            req.num_output_tokens += d
            req.last_token = self.last

    def leave(self, req: Request) -> None:
        """Take member ``req`` out, its counters brought up to date (no-op if not a member)."""
        b = self.members.pop(req, None)
        if b is None:
            return
        self._write(req, b[0])
        self.kv -= req.num_computed_tokens
        self.size -= 1
        at = self.reqs.index(req)
        del self.reqs[at]
        del self.entries[at]

    def sync(self) -> None:
        """Bring every member's counters up to date; they stay members."""
        base, now = self.members, self.steps
        for req, (since, seq) in base.items():
            if since != now:
                self._write(req, since)
                base[req] = (now, seq)

    def clear(self) -> None:
        """Bring every member's counters up to date and empty the pool."""
        self.sync()
        self.members.clear()
        self._heap.clear()
        self.entries.clear()
        self.reqs.clear()
        self.kv = self.size = 0
