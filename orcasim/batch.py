"""A running batch in which every member gains exactly one token per step.

This is iteration-level (Orca) decoding with the prompt already in the KV
cache: each step, every sequence in the batch emits one token. Because the
progress of every member is the same, the batch keeps one step counter and
each member's *finish step* in a heap, instead of touching every member every
step. A step costs O(1) plus O(log B) per sequence that joins or leaves, so a
run's cost grows with the number of requests, not with tokens x batch size.

Members hold a slot (the lowest free index), which is what the per-step table
prints (``step 3: C | B``) and what a Gantt chart by slot draws.

Pure data structure: no SimPy.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from orcasim.request import Request


class DecodeBatch:
    """Sequences in decode, advanced together one token per step.

    ``num_kv_tokens`` is the total number of tokens (prompt + generated) held
    in the KV cache by the members, as the next step will read them.
    """

    __slots__ = ("_free_slots", "_heap", "_members", "_next_seq", "_next_slot", "num_kv_tokens",
                 "num_steps", "size")

    def __init__(self) -> None:
        self.num_steps = 0
        self.num_kv_tokens = 0
        self.size = 0
        self._heap: list[tuple[int, int, Request]] = []
        self._members: dict[int, Request] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._next_seq = 0

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[Request]:
        """Members in the order they joined."""
        return iter(self._members.values())

    def add(self, req: Request) -> None:
        """Add ``req``; it emits its next token at the end of the next step."""
        remaining = req.output_len - req.num_output_tokens
        if remaining <= 0:
            raise ValueError(f"request {req.label} has no tokens left to generate")
        seq = self._next_seq
        self._next_seq = seq + 1
        req._batch_seq = seq
        req._done_at = self.num_steps + remaining
        heapq.heappush(self._heap, (req._done_at, seq, req))
        self._members[seq] = req
        self.size += 1
        if self._free_slots:
            req.slot = heapq.heappop(self._free_slots)
        else:
            req.slot = self._next_slot
            self._next_slot += 1
        self.num_kv_tokens += req.prompt_len + req.num_output_tokens

    def advance(self, k: int = 1) -> list[Request]:
        """Run ``k`` steps (nobody may finish before the last): every member gains ``k`` tokens.

        Return the members that finished in the last step; they leave the
        batch with ``num_output_tokens == output_len``, in the order they joined.
        """
        self.num_steps = step = self.num_steps + k
        self.num_kv_tokens += self.size * k
        heap = self._heap
        if not heap:
            return []
        first = heap[0][0]
        if first != step:
            if first < step:
                self.num_steps -= k
                self.num_kv_tokens -= self.size * k
                raise ValueError(f"cannot advance {k} steps: a member finishes in "
                                 f"{first - self.num_steps}")
            return []
        done: list[Request] = []
        pop = heapq.heappop
        members = self._members
        free = self._free_slots
        while heap and heap[0][0] == step:
            _, seq, req = pop(heap)
            if req._batch_seq != seq:  # removed earlier
                continue
            req.num_output_tokens = out = req.output_len  # leaves (as _leave does)
            del members[seq]
            req._batch_seq = -1
            self.num_kv_tokens -= req.prompt_len + out
            heapq.heappush(free, req.slot)
            req.slot = -1
            done.append(req)
        self.size -= len(done)
        return done

    def drop_removed(self) -> None:
        """Drop the earliest finish entries of members removed early (preempted, aborted), so
        :meth:`first_finish` is a live member's finish again."""
        heap = self._heap
        while heap and heap[0][2]._batch_seq != heap[0][1]:
            heapq.heappop(heap)

    def first_finish(self) -> int:
        """Steps from now until the first member may finish (the next step is 1).

        A member removed early may still hold the earliest entry, so no
        member finishes *before* this step; one may not finish at it.
        """
        return self._heap[0][0] - self.num_steps

    def skip(self, k: int) -> None:
        """Run ``k`` steps in which nobody finishes (``k < first_finish()``), as ``k`` advances."""
        if not 0 <= k < self.first_finish():
            raise ValueError(f"cannot skip {k} steps: a member finishes in {self.first_finish()}")
        self.num_steps += k
        self.num_kv_tokens += self.size * k

    def output_tokens(self, req: Request) -> int:
        """Tokens ``req`` has generated so far (members are tracked lazily)."""
        if req._batch_seq < 0:
            return req.num_output_tokens
        return req.output_len - (req._done_at - self.num_steps)

    def remove(self, req: Request) -> None:
        """Take ``req`` out before it finishes (preemption, abort); writes back its counters."""
        if req._batch_seq < 0 or self._members.get(req._batch_seq) is not req:
            raise ValueError(f"request {req.label} is not in the batch")
        req.num_output_tokens = self.output_tokens(req)
        self._leave(req)

    def _leave(self, req: Request) -> None:
        """Drop a member whose ``num_output_tokens`` is up to date."""
        del self._members[req._batch_seq]
        self.size -= 1
        req._batch_seq = -1
        self.num_kv_tokens -= req.prompt_len + req.num_output_tokens
        heapq.heappush(self._free_slots, req.slot)
        req.slot = -1

    def newest(self) -> Request | None:
        """The member that joined last (``None`` if the batch is empty)."""
        return next(reversed(self._members.values()), None)

    def slot_view(self) -> list[Request | None]:
        """Members by slot index, ``None`` for an empty slot (for per-step tables)."""
        view: list[Request | None] = [None] * self._next_slot
        for req in self._members.values():
            view[req.slot] = req
        return view
