"""``srpt``: shortest remaining (predicted) processing time first, preemptive.

A request's remaining time is its predicted output length (true, or with a
lognormal error ``sigma``; see ``sjf``) minus the tokens it has generated.
Waiting requests are admitted by it; when the batch is full, the running
request with the longest remaining time is preempted (by recompute) for a
waiting one with a strictly shorter remaining time. A request that outlives
its prediction has 0 left and is never preempted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from orcasim.context import SchedulerContext
from orcasim.policies.common import BatchPolicy
from orcasim.policies.keyed import KeyedPolicy
from orcasim.policies.keys import KeyCache
from orcasim.policies.sjf import SJF, LengthParams
from orcasim.registry import policies
from orcasim.request import Request


@policies.register("srpt")
class SRPT(SJF):
    """Shortest remaining (predicted) output first; preempts longer running requests.

    The running requests' order changes as they decode, so it is sorted
    once per step boundary; the requests admitted and preempted at that
    boundary keep it up to date (its last is the victim), as a static key's
    order is kept (see :class:`~orcasim.policies.keyed.KeyedPolicy`).
    """

    Params = LengthParams

    def __init__(self, params: LengthParams, ctx: SchedulerContext) -> None:
        super().__init__(params, ctx)
        self.preemptive = True
        # the predictions by request: kept as the key cache (unused with keys that change),
        # which :meth:`~orcasim.policies.keyed.KeyedPolicy.release` empties as requests leave
        self._preds = self._keys = preds = KeyCache(self.predict)
        self._sorted_at = -1.0  # the time self._ordered was last put in order
        #: whether remaining lengths are whole numbers that stay above 0 while running
        self._exact = self.predict.sigma == 0.0
        #: a waiting request's key is its rank as it is admitted (as floats: the same order)
        #: with the true lengths, for this class's key and ranks
        self._rank_is_key = self._exact and type(self).key is SRPT.key
        #: whether decode_entries may hand the kept entries over after a run (found at its
        #: first call)
        self._kept_entries: bool | None = None
        pool = self.pool
        if pool is None:
            def rank(req: Request) -> Any:  # key(), with the prediction looked up
                left = preds[req] - req.num_output_tokens
                return (left if left > 0.0 else 0.0, req.arrival)
        elif self._exact:
            members = pool.members

            def rank(req: Request) -> Any:  # the same with the true lengths, in whole numbers
                b = members.get(req)  # (which compare with the queue's keys as numbers)
                left = req.output_len - req.num_output_tokens if b is None else (
                    req.output_len - req.num_output_tokens - pool.steps + b[0])
                return (left if left > 0 else 0, req.arrival)
        else:
            members = pool.members

            def rank(req: Request) -> Any:  # the same, for a member of the pool too
                b = members.get(req)
                out = req.num_output_tokens if b is None else (
                    req.num_output_tokens + pool.steps - b[0])  # (pool.output_tokens(req))
                left = preds[req] - out
                return (left if left > 0.0 else 0.0, req.arrival)

        self.rank = rank

    static_keys = False  # the remaining length shrinks as it decodes

    key_width = 2  # (key: a pair)

    def key(self, req: Request) -> Any:
        return (max(self.predict(req) - req.num_output_tokens, 0.0), req.arrival)

    def index_key(self, source: Any) -> Callable[[int], Any] | None:
        of_row, output, arrival = self.predict.of_row, source._output, source._arrival
        if self.predict.sigma == 0.0:  # (of_row: the true length, at least 0; a whole
            # number compares as its float, and faster with the heap's other whole numbers)
            return lambda i: (output[i], arrival[i])
        return lambda i: (max(of_row(i, output[i]) - 0, 0.0), arrival[i])  # (nothing generated)

    def pool_safe(self) -> bool:
        return True  # its rank reads the pool

    def order(self, reqs: list[Request]) -> Iterable[Request]:
        """The running requests by remaining length, sorted once per step boundary.

        After a run in which every running request emitted the same number
        of tokens, the order kept since the run was planned still holds when
        the predictions are the true lengths: every remaining length fell by
        the same whole number and none reached 0 (a request finishes at its
        length), so nothing needs sorting.
        """
        if reqs is not self.running:
            return sorted(reqs, key=self.rank)
        ordered = self._ordered
        decoding = self.decoding
        if not (self._exact and decoding is not None and decoding[0] is reqs
                and ordered is not None and len(ordered) == len(reqs)):
            ordered = self._ordered = sorted(reqs, key=self.rank)
        self._sorted_at = self.ctx.env._now  # kept as requests come and go until a step ends
        return ordered

    def decode_entries(self) -> list[tuple[Request, int]]:
        """:meth:`KeyedPolicy.decode_entries`, at once right after a run with the true
        lengths (then :meth:`order` keeps its order, and the entries kept with it hold)."""
        kept = self._kept_entries
        if kept is None:  # (this class's order and entries, as defined)
            kept = self._kept_entries = (
                self._exact and type(self).order is PLAIN[0]
                and KeyedPolicy.decode_entries is PLAIN[1]
                and type(self).order_running is BatchPolicy.order_running)
        ordered, entries, running = self._ordered, self._entries, self.running
        decoding = self.decoding
        if (kept and decoding is not None and decoding[0] is running
                and ordered is not None and entries is not None and self._entries_of is ordered
                and len(entries) == len(ordered) == len(running)):
            self._sorted_at = self.ctx.env._now  # (order)
            return entries.copy()
        return super().decode_entries()

    def arrival_floor(self) -> Any:
        """The least true output length of a request arriving from now on that cannot preempt
        a running one while the batch runs unchanged (``None``: any arrival may).

        With the true lengths, an arrival's key is its output length and its arrival, after
        every running request's: it preempts only with a length below the largest remaining
        one, which only shrinks while they decode. That largest one now is the floor.
        """
        if not (self._rank_is_key and self.pool is not None and self.running
                and type(self).victim is KeyedPolicy.victim
                and type(self).index_key is SRPT.index_key):
            return None
        return self.rank(self.memory_victim())[0]

    victim_rule = "sorted"  # (memory_victim: the kept order's last, if sorted at this boundary)

    def memory_victim(self) -> Request:
        ordered = self._ordered
        if (ordered is not None and self._sorted_at == self.ctx.env._now
                and len(ordered) == len(self.running)):
            return ordered[-1]
        return max(reversed(self.running), key=self.rank)


#: :meth:`SRPT.order` and the keyed decode entries, as defined (a subclass, or a test, that
#: replaces one of them sees every run's entries made through it)
PLAIN = (SRPT.order, KeyedPolicy.decode_entries)
