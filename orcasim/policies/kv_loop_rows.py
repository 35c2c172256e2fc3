"""Workload rows of :class:`~orcasim.policies.kv_loop.KVDecodeLoop` made requests again.

In the loop a request of the backlog joins the batch as a workload row
``[index, first scheduled, first token, slot, finish step]``, and a row
preempted by recompute goes back in front of the queue as a row too, with
``[generated tokens, preemptions, last token]`` added
(:meth:`~orcasim.policies.kv_preempt.KVPreemption._recompute_newest`). Where
the loop stops, or hands an admission to the policy's own path, the rows
become the :class:`~orcasim.request.Request` objects the policy's own steps
would have made.
"""

from __future__ import annotations

from typing import Any

from orcasim.policies.kv_preempt import queued_request, row_request
from orcasim.request import Request

#: stands for a member that left the batch in a stale entry of its finish heap
GONE = Request(-1, 0.0, 0, 0)


class KVLoopRows:
    """:meth:`_to_requests` and :meth:`_queued_requests`, for ``KVDecodeLoop``."""

    batch: Any
    source: Any
    policy: Any

    def _to_requests(self) -> None:
        """The batch's rows and the queue's rows become requests; a row's entry in the
        batch's finish heap that is stale (the row was preempted) becomes :data:`GONE`'s."""
        members, heap, src = self.batch._members, self.batch._heap, self.source
        made: dict[int, Request] = {}  # by the id of the list it replaces
        for at, (done_at, seq, m) in enumerate(heap):
            if type(m) is list:
                if members.get(seq) is m:
                    made[id(m)] = members[seq] = req = row_request(src, m, seq)
                    heap[at] = (done_at, seq, req)
                else:
                    heap[at] = (done_at, seq, GONE)
        policy = self.policy
        if made:
            policy._joined = [made.get(id(m), m) for m in policy._joined]
        self._queued_requests()

    def _queued_requests(self) -> None:
        """The rows waiting in front of the queue (preempted) become requests, and so does
        the last refused one (``policy._miss``)."""
        head = self.policy.ctx.waiting._head
        miss = self.policy._miss
        if head and any(type(m) is list for m in head):
            src = self.source
            for at, m in enumerate(head):
                if type(m) is list:
                    head[at] = req = queued_request(src, m)
                    if miss is not None and miss[0] is m:
                        self.policy._miss = (req, *miss[1:])
