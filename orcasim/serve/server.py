"""The HTTP side of ``orcasim serve``: an aiohttp application over a :class:`LiveSimulation`.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming
over server-sent events, or one JSON answer), ``GET /v1/models``,
``GET /health`` and ``GET /metrics``. Each completion request becomes a
request of the simulation, arriving when the simulation thread receives it;
its tokens are sent when the simulation emits them (a streamed chunk per
engine step). A client that disconnects cancels its request in the
simulation (``client_disconnected``: its batch slot and KV blocks are freed).

Statuses: 400 for a bad body (and for a request the engine rejects as too
long for its memory or context), 404 for an unknown model, 429 when admission
control rejects, 503 once the server is stopping (and for requests aborted by
the stop). Errors are OpenAI-style JSON (``{"error": {...}}``); a request
that fails after its stream started ends with an ``error`` event and
``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from orcasim.metrics.results import VariantResult
from orcasim.request import RequestState
from orcasim.serve import api
from orcasim.serve.live import SIMULATION_ERROR, LiveSimulation, Ticket

#: rejection and abort reasons answered with 400 (the request can never run)
TOO_LARGE = frozenset({"prompt_too_long", "exceeds_max_model_len", "exceeds_kv_capacity"})
#: rejection and abort reasons answered with 503 (the server is going away)
UNAVAILABLE = frozenset({"stopped", "draining", "shutdown"})
#: largest request body, bytes
MAX_BODY = 64 * 1024 * 1024


def failure(ticket: Ticket) -> api.ApiError:
    """The error answering a rejected or aborted ``ticket``."""
    reason = ticket.reason or "rejected"
    if reason == SIMULATION_ERROR:
        return api.ApiError(500, "the simulated engine failed; see the server's output")
    if reason in TOO_LARGE:
        status = 400
    elif reason in UNAVAILABLE:
        status = 503
    else:
        status = 429
    verb = "rejected" if ticket.state == RequestState.REJECTED else "aborted"
    return api.ApiError(status, f"request {verb} by the simulated engine: {reason}")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj), status=status, content_type="application/json")


def _error(err: api.ApiError) -> web.Response:
    return _json(err.body(), err.status)


class SimServer:
    """The application over ``sim``; ``lengths`` gives each request's drawn output length."""

    def __init__(self, sim_factory: Callable[[Callable[[list[Ticket]], None]], LiveSimulation],
                 *, model: str, lengths: Sequence[int],
                 count: Callable[[str], int] | None = None) -> None:
        self._factory = sim_factory
        self.sim: LiveSimulation | None = None
        self.model = model
        self.lengths = list(lengths)
        self.count = count
        self._next_length = 0
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.port = 0
        self._registry: Any = None
        #: the served run's results, once stopped
        self.result: VariantResult | None = None

    # -- life cycle ----------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start the simulation and listen; return the port (a free one for ``port=0``)."""
        from prometheus_client import CollectorRegistry

        from orcasim.serve.metrics import collector

        self._loop = asyncio.get_running_loop()
        self.sim = self._factory(self._notify)
        self._registry = CollectorRegistry(auto_describe=True)
        self._registry.register(collector(self.sim.metrics, self.sim.snapshot, self.model))
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        app.add_routes([
            web.post("/v1/completions", self._completions),
            web.post("/v1/chat/completions", self._chat),
            web.get("/v1/models", self._models),
            web.get("/health", self._health),
            web.get("/metrics", self._metrics),
        ])
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        self.sim.start()
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self, grace: float = 5.0) -> VariantResult:
        """Stop: abort what is in flight (recorded), answer it, close; the served results."""
        sim = self.sim
        assert sim is not None and self._runner is not None
        sim.stop()
        loop = asyncio.get_running_loop()
        done = await loop.run_in_executor(None, sim.join, 60.0)
        if self._handlers:  # let the handlers answer their aborted requests
            await asyncio.wait(list(self._handlers), timeout=grace)
        await self._runner.cleanup()
        if not done:
            raise RuntimeError("the simulation thread did not stop")
        if sim.error is not None:
            raise sim.error
        assert sim.result is not None
        self.result = sim.result
        return sim.result

    def _notify(self, tickets: list[Ticket]) -> None:
        """From the simulation thread: wake the handlers of ``tickets`` on the event loop."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(_wake, tickets)

    # -- routes ------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every failure as OpenAI-style JSON, never a traceback page."""
        try:
            return await handler(request)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            return _error(api.ApiError(err.status, err.reason))
        except api.ApiError as err:
            return _error(err)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "orcasim",
             "root": self.model, "parent": None}]})

    async def _health(self, request: web.Request) -> web.Response:
        if self.sim is None or self.sim.stopping:
            return _error(api.ApiError(503, "the server is stopping"))
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(body=generate_latest(self._registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _draw_length(self) -> int:
        n = self.lengths[self._next_length % len(self.lengths)]
        self._next_length += 1
        return n

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        sim = self.sim
        assert sim is not None
        raw = await request.read()
        c = api.parse_request(raw, chat=chat, models=[self.model], count=self.count)
        if sim.stopping:  # checked with no await before the submit: none is submitted late
            raise api.ApiError(503, "the server is stopping")
        out = c.output_len(self._draw_length())
        ticket = Ticket(c.prompt_len, out, asyncio.Event(), c.finish_reason(out))
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        created = int(time.time())
        sim.submit(ticket)
        try:
            if c.stream:
                return await self._stream(request, c, ticket, rid, created)
            while not ticket.done:
                await _wait(ticket)
            if ticket.state != RequestState.FINISHED:
                raise failure(ticket)
            return _json(api.response_body(c, rid, created, ticket.prompt_len, ticket.tokens,
                                           ticket.finish_reason))
        except (asyncio.CancelledError, ConnectionError):
            sim.cancel(ticket)  # the client went away
            raise
        finally:
            self._handlers.discard(task)

    async def _stream(self, request: web.Request, c: api.Completion, ticket: Ticket, rid: str,
                      created: int) -> web.StreamResponse:
        while ticket.tokens == 0 and not ticket.done:
            await _wait(ticket)
        if ticket.tokens == 0 and ticket.state != RequestState.FINISHED:
            raise failure(ticket)  # nothing sent yet: a plain error answer
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        prefix, suffix = api.chunk_template(c, rid, created)
        token = api.TOKEN_TEXT.encode()
        sent = 0
        while True:
            n, done = ticket.tokens, ticket.done
            data = b""
            if n > sent:
                last = done and n == ticket.output_len and ticket.state == RequestState.FINISHED
                if sent and not last and not c.continuous_usage:
                    data = prefix + token * (n - sent) + suffix
                else:
                    so_far = (ticket.prompt_len, n) if c.continuous_usage else None
                    data = api.sse(api.chunk(
                        c, rid, created, n - sent, ticket.finish_reason if last else None,
                        first=sent == 0, so_far=so_far))
                sent = n
            if done:  # the last events in one write
                if ticket.state == RequestState.FINISHED:
                    if c.include_usage:
                        data += api.sse(api.usage_chunk(c, rid, created, ticket.prompt_len,
                                                        sent))
                else:
                    data += api.sse(failure(ticket).body())
                await resp.write_eof(data + api.sse("[DONE]"))
                return resp
            if data:
                await resp.write(data)
            await _wait(ticket)


async def _wait(ticket: Ticket) -> None:
    ev: asyncio.Event = ticket.waiter
    await ev.wait()
    ev.clear()


def _wake(tickets: list[Ticket]) -> None:
    for t in tickets:
        t.waiter.set()
