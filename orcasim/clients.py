"""Clients as SimPy processes: patience and timeouts that abort a request where it is.

A client that has waited ``patience`` seconds after its request arrived
without receiving a first token gives up; one whose request has not finished
``timeout`` seconds after arrival gives up too. Either way the request ends
``aborted`` with reason ``client_timeout``, wherever it is (waiting, running,
preempted or swapped out), and its batch slot and KV memory are freed at
once; tokens it generated stay counted. Limits come per request (the
workload's ``patience`` and ``timeout`` attributes) or from the scenario's
``clients:`` section for every request.

Only a request with a limit gets a client process; a plain open-loop request
stays a lightweight record, released by the source at its arrival time.
Closed-loop users and multi-turn conversations (a think time after each
turn) are released by :class:`~orcasim.source.ChainedSource`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy
from pydantic import Field

from orcasim.params import ComponentParams
from orcasim.request import FINAL_STATES, Request
from orcasim.source import delay_until

if TYPE_CHECKING:
    from orcasim.context import SchedulerContext

#: abort reason of a request whose client gave up
CLIENT_TIMEOUT = "client_timeout"


class ClientOptions(ComponentParams):
    """The ``clients:`` section: limits for every request without its own."""

    patience: float | None = Field(None, gt=0, description="a client gives up when no first "
                                   "token has come this many seconds after arrival")
    timeout: float | None = Field(None, gt=0, description="a client gives up when its request "
                                  "has not finished this many seconds after arrival")


class Clients:
    """Starts a client process for each arriving request that has a limit."""

    def __init__(self, ctx: SchedulerContext, options: ClientOptions | None = None) -> None:
        self.ctx = ctx
        self.patience = options.patience if options is not None else None
        self.timeout = options.timeout if options is not None else None
        self.num_gave_up = 0

    def watch(self, req: Request) -> None:
        """``req`` was queued: follow it if its client has a limit."""
        patience = req.patience if req.patience is not None else self.patience
        timeout = req.timeout if req.timeout is not None else self.timeout
        if patience is not None or timeout is not None:
            self.ctx.env.process(self.client(req, patience, timeout))

    def client(self, req: Request, patience: float | None,
               timeout: float | None) -> Generator[simpy.Event, None, None]:
        """Wait for the first token until ``patience``, for the end until ``timeout``."""
        env = self.ctx.env
        if patience is not None and (timeout is None or patience < timeout):
            yield env.timeout(delay_until(env.now, req.arrival + patience))
            if req.state in FINAL_STATES:
                return
            if req.first_token is None:
                self.give_up(req)
                return
        if timeout is not None:
            yield env.timeout(delay_until(env.now, req.arrival + timeout))
            if req.state not in FINAL_STATES:
                self.give_up(req)

    def give_up(self, req: Request) -> None:
        """Abort ``req`` with reason ``client_timeout``, freeing what it holds."""
        self.num_gave_up += 1
        self.ctx.cancel(req, CLIENT_TIMEOUT)
