"""Admission from a lazy source's backlog, first come first served, without memory limits.

:meth:`BatchPolicy.admit_waiting <orcasim.policies.common.BatchPolicy.admit_waiting>`
takes the head of ``ctx.waiting`` while the batch has room and budget is left.
When the queue is a :class:`~orcasim.backlog.Backlog` (arrived requests kept as
workload rows), the policy has no memory limit and does not preempt,
:func:`admit_from_backlog` takes the same steps reading the backlog's head and
rows directly: a row is made into its request when it reaches the head, as the
backlog's own ``queue[0]`` does.
"""

from __future__ import annotations

from typing import Any

from orcasim.backlog import Backlog
from orcasim.request import Request


def admit_from_backlog(policy: Any, backlog: Backlog, scheduled: list[tuple[Request, int]],
                       budget: int, hook: bool) -> int:
    """Admit from the head of ``backlog`` into ``scheduled`` as ``policy.admit_waiting``
    does; return the budget left. ``hook``: call ``policy.admitted`` for each admission."""
    ctx = policy.ctx
    slots = ctx.slots
    running = policy.running
    head_q = backlog._head
    src = backlog._source
    make, arrival = src._request, src._arrival
    admit = ctx.admit
    while budget > 0 and slots.count < slots.capacity:
        if head_q:
            head = head_q[0]
        elif backlog._lo < backlog._hi:  # (the backlog's queue[0])
            i = backlog._lo
            backlog._lo = i + 1
            head = make(i, arrival[i])
            head_q.append(head)
        else:
            break
        need = (head.prompt_len or 1) + head.num_output_tokens - head.num_computed_tokens
        if need > budget:
            if policy.chunked:
                need = budget
            elif scheduled:
                break  # head-of-line: it waits for a step with room
            elif head.num_output_tokens == 0 and need > policy.params.token_budget:
                head_q.popleft()
                ctx.reject(head, "prompt_too_long")
                continue
        head_q.popleft()
        admit(head)
        running.append(head)
        policy.decoding = None  # the batch changed
        scheduled.append((head, need))
        budget -= need
        if hook:
            policy.admitted(head)
    return budget
