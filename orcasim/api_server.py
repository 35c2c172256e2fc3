"""The API server between the clients and the engine's queue, as a request source.

A served request is sent by its client, passes the API server (one process,
first come first served: receive, parse, tokenise) and only then joins the
engine's waiting queue; the client sees every token one streamed message
later than the step that produced it (:class:`~orcasim.frontend.FrontendOptions`).
:class:`ApiServer` stands between the workload's source and the context:

- it is the context's source (``ctx.source``): the engine polls it, and it
  forwards to the workload's own source, so arrivals released at run time
  (load stages, multi-turn rounds, closed-loop clients) pass it too;
- a request the source sends at ``s`` reaches the engine's queue at ``q =
  max(s, q_prev) + request_s + per_prompt_token_s x prompt_len``; its
  ``arrival`` becomes ``q`` (the engine's metrics start there, as vLLM's
  ``queued_ts`` does) and :attr:`sent` keeps ``s`` for the client's view;
  a client limit (``timeout``, ``patience``) keeps counting from ``s``;
- the source learns that a finished request ended one message delay after
  its last token (when its client receives it), so the next multi-turn round
  or load stage starts from there;
- with ``max_model_len``, a request whose prompt plus ``max_tokens`` (its
  output length: a workload that sends ``max_tokens`` with ``ignore_eos``)
  exceeds it is rejected by the server when it is through with it (reason
  ``max_tokens_exceeds_max_model_len``; its ``arrival`` is that time), as
  vLLM's OpenAI server answers such a request with HTTP 400 ("This model's
  maximum context length is ... However, you requested ...") before it
  reaches the engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from orcasim.context import SchedulerContext
from orcasim.frontend import FrontendOptions
from orcasim.request import Request, RequestState
from orcasim.source import ArrivalSource, OpenLoopSource, delay_until

#: the rejection reason of a request the API server refuses (HTTP 400)
TOO_LONG = "max_tokens_exceeds_max_model_len"


class ApiServer(ArrivalSource):
    """The API server as the context's source (see the module docstring)."""

    def __init__(self, env: simpy.Environment, ctx: SchedulerContext, inner: OpenLoopSource,
                 num_requests: int, timing: FrontendOptions | None,
                 max_model_len: int | None = None) -> None:
        self.env = env
        self.ctx = ctx
        self.inner = inner
        self.timing = timing
        self.max_model_len = max_model_len
        #: when each request was sent by its client (NaN: never sent)
        self.sent = np.full(num_requests, np.nan)
        self._queue: deque[tuple[float, Request]] = deque()  # (reaches the engine, request)
        self._free = -np.inf
        self._engine_submit = ctx.submit
        # the workload's source sends through this server: ctx.submit is the client's send
        ctx.submit = self.receive  # type: ignore[method-assign]
        ctx.source = self  # type: ignore[assignment]
        end = ctx.on_end
        delay = timing.per_output_s if timing is not None else 0.0
        if end is not None and delay > 0:
            def seen_by_client(req: Request) -> None:
                if req.state == RequestState.FINISHED:
                    env.timeout(delay).callbacks.append(lambda _e: end(req))
                else:
                    end(req)
            ctx.on_end = seen_by_client

    # -- what the context asks of a source ------------------------------------------
    @property
    def exhausted(self) -> bool:
        return self.inner.exhausted and not self._queue

    def next_arrival(self) -> float | None:
        t = self.inner.next_arrival()
        if self._queue and (t is None or self._queue[0][0] < t):
            return self._queue[0][0]
        return t

    def pending_until(self, now: float) -> bool:
        return self.inner.pending_until(now) or (bool(self._queue) and self._queue[0][0] <= now)

    def flush(self, now: float) -> None:
        """Let the source send what is due, then hand the engine what the server is done with."""
        if self.inner.pending_until(now):
            self.inner.flush(now)
        self._deliver(now)

    # -- the server ---------------------------------------------------------------
    def receive(self, req: Request) -> None:
        """A client sends ``req`` (at ``req.arrival``): it queues for the server."""
        s = req.arrival
        self.sent[req.id] = s
        q = s
        if self.timing is not None:
            q = max(s, self._free) + self.timing.service(req.prompt_len)
            self._free = q
        self._queue.append((q, req))
        if q <= self.env.now:
            self._deliver(self.env.now)
        else:
            self.env.timeout(delay_until(self.env.now, q)).callbacks.append(self._wake)

    def _wake(self, _event: simpy.Event) -> None:
        self._deliver(self.env.now)

    def _deliver(self, now: float) -> None:
        queue, limit = self._queue, self.max_model_len
        while queue and queue[0][0] <= now:
            q, req = queue.popleft()
            waited = q - req.arrival
            req.arrival = q
            if limit is not None and req.prompt_len + req.output_len > limit:
                self.ctx.refuse(req, TOO_LONG)
                continue
            if waited > 0:
                self._shift_limits(req, waited)
            self._engine_submit(req)

    def _shift_limits(self, req: Request, waited: float) -> None:
        """A client's limits count from its send: less is left once the server is through."""
        clients = self.ctx.clients
        default: Callable[[str], float | None] = (
            (lambda name: getattr(clients, name)) if clients is not None else (lambda _n: None))
        for name in ("timeout", "patience"):
            limit = getattr(req, name)
            if limit is None:
                limit = default(name)
            if limit is not None:
                setattr(req, name, max(limit - waited, 0.0))
