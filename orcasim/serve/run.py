"""Serve one variant of a scenario until SIGINT or SIGTERM, then return its results.

:func:`serve_variant` is what ``orcasim serve`` runs; :func:`serving` is the
same server as an async context manager, for programs and tests that drive
it themselves.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import numpy as np

from orcasim.errors import UsageError
from orcasim.metrics.results import VariantResult
from orcasim.scenario import VariantConfig
from orcasim.serve.live import LiveSimulation, Ticket
from orcasim.serve.server import SimServer


def lag_summary(sim_lags: Sequence[float]) -> dict[str, float]:
    """``realtime_lag_p50``, ``_p99`` and ``_max`` (s) of the lags a served run measured."""
    a = np.asarray(sim_lags, dtype=np.float64)
    if a.size == 0:
        return {}
    p50, p99 = np.percentile(a, [50, 99])
    return {"realtime_lag_p50": float(p50), "realtime_lag_p99": float(p99),
            "realtime_lag_max": float(a.max())}


def make_server(cfg: VariantConfig, *, seed: int, lengths: Sequence[int], model: str,
                count: Callable[[str], int] | None = None, factor: float = 1.0) -> SimServer:
    """A server of ``cfg`` (not started): output lengths drawn in turn from ``lengths``.
    A configuration with a cluster serves the cluster (its router receives the requests)."""
    from orcasim.serve.live_cluster import LiveCluster, check_servable

    check_servable(cfg)
    cls = LiveSimulation if cfg.cluster is None else LiveCluster

    def factory(notify: Callable[[list[Ticket]], None]) -> LiveSimulation:
        return cls(cfg, seed=seed, notify=notify, factor=factor)

    return SimServer(factory, model=model, lengths=lengths, count=count)


@asynccontextmanager
async def serving(server: SimServer, host: str = "127.0.0.1",
                  port: int = 0) -> AsyncIterator[SimServer]:
    """Start ``server`` (``server.port`` is then the bound port); stop it on leaving."""
    try:
        await server.start(host, port)
    except OSError as err:
        raise UsageError(f"--port {port}: cannot listen on {host}:{port}: "
                         f"{err.strerror or err}") from None
    try:
        yield server
    finally:
        if server.sim is not None and server.result is None:
            await server.stop()


async def serve_until_signal(server: SimServer, host: str, port: int,
                             on_ready: Callable[[SimServer], None]) -> VariantResult:
    """Serve until SIGINT or SIGTERM; abort what is in flight; the served run's results."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving(server, host, port):
            on_ready(server)
            assert server.sim is not None
            ended = loop.run_in_executor(None, server.sim.join)  # the simulation failed
            await asyncio.wait([asyncio.ensure_future(stop.wait()), ended],
                               return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    assert server.result is not None
    return server.result


def finish_result(server: SimServer) -> VariantResult:
    """The served run's results with its real-time lag figures added to the summary, and
    ``served_start_unix``: the wall clock at simulated time 0, to line up a client's own
    timestamps with the served requests' simulated times."""
    assert server.result is not None and server.sim is not None
    res = server.result
    res.summary.update(lag_summary(server.sim.lags))
    res.summary["served_start_unix"] = server.sim.start_unix
    return res
