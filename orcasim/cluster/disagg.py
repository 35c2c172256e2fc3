"""Disaggregated prefill and decode: prefill replicas compute prompts, decode replicas the rest.

With ``role: prefill`` and ``role: decode`` groups, the router sends each
request to a prefill replica, which runs it up to its first token (the
prompt, chunked as its policy does, and one sampled token). The request's KV
cache then moves to the decode replica with the fewest outstanding requests
over the cluster's ``link``: a SimPy resource with ``concurrency`` parallel
transfers, each taking ``latency_s + prompt tokens x bytes per token /
bandwidth``. When the transfer ends the blocks are installed in the decode
replica's prefix cache and the request joins its queue; when the decode
replica schedules it, it computes only the last partial block and the token
after the first (blocks evicted meanwhile are recomputed). TTFT is the
prefill replica's first token; the gap to the second token (transfer, link
queue and decode queue) counts as an inter-token latency.

Both roles run ``vllm-v1`` (its block-level prefix cache receives the KV).
Not modelled: the decode replica reserving blocks before the transfer starts,
and prefill blocks held until the transfer ends (they are freed, and cached,
at the first token).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from orcasim.metrics.recorder import Recorder
from orcasim.request import Request, RequestState

if TYPE_CHECKING:
    from orcasim.cluster.config import LinkOptions
    from orcasim.cluster.model import ClusterModel, Replica

#: link presets: (bytes per second, latency in seconds)
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "nvlink": (450e9, 2e-6),
    "infiniband_400g": (50e9, 5e-6),
    "roce_100g": (12.5e9, 10e-6),
    "pcie_gen5": (64e9, 2e-6),
}


class HandoffRecorder(Recorder):
    """A prefill replica's recorder: a request that reaches its first token here is handed to
    the decode side instead of being recorded as finished."""

    handoff: Any = None  # (request) -> True if it was handed off

    def record_request(self, req: Request) -> None:
        if req.state == RequestState.FINISHED and self.handoff is not None and \
                self.handoff(req):
            return
        super().record_request(req)


class Disaggregation:
    """Moves requests from prefill to decode replicas over the link; counts transfers."""

    def __init__(self, model: ClusterModel, link: LinkOptions, bytes_per_token: int) -> None:
        self.model = model
        self.env = model.env
        bw, lat = LINK_PRESETS[link.preset] if link.preset is not None else (0.0, 0.0)
        self.bandwidth = link.bandwidth_gb_s * 1e9 if link.bandwidth_gb_s is not None else bw
        self.latency = link.latency_s if link.latency_s is not None else lat
        self.bytes_per_token = bytes_per_token
        self.link = simpy.Resource(self.env, capacity=link.concurrency)
        self.decode = [r for r in model.replicas if r.group.role == "decode"]
        self._output_len: dict[int, int] = {}
        self.num_transfers = 0
        self.transfer_bytes = 0
        self.transfer_time = 0.0
        self.link_wait = 0.0
        router = model.router
        router.dynamic = True  # a request in transfer is still on its way
        router.prepare = self._to_prefill
        for r in model.replicas:
            if r.group.role == "decode":
                router.view.set_available(r.index, False)  # arrivals go to prefill replicas
            else:
                assert isinstance(r.recorder, HandoffRecorder)
                r.recorder.handoff = self._handoff(r)

    def _to_prefill(self, req: Request) -> None:
        """Before a prefill replica gets ``req``: it runs to the first token only."""
        self._output_len[req.id] = req.output_len
        req.output_len = 1

    def _handoff(self, r: Replica) -> Any:
        router = self.model.router

        def handoff(req: Request) -> bool:
            out = self._output_len.pop(req.id)
            req.output_len = out
            if out <= 1 or req.reason is not None:  # done at the first token
                return False
            r.recorder.num_arrived -= 1  # it ends on a decode replica
            req.state = RequestState.WAITING
            req.finish = None
            router.total_outstanding += 1  # on its way (the prefill replica lets go of it)
            self.env.process(self._transfer(req))
            return True

        return handoff

    def _transfer(self, req: Request) -> Generator[simpy.Event, Any, None]:
        router, env = self.model.router, self.env
        out = router.live_outstanding
        dest = min(self.decode, key=lambda d: (out[d.index], d.index))
        router.attach(dest.index, req)
        t0 = env.now
        with self.link.request() as slot:
            yield slot
            t1 = env.now
            size = req.prompt_len * self.bytes_per_token
            yield env.timeout(self.latency + size / self.bandwidth)
        self.num_transfers += 1
        self.transfer_bytes += size
        self.link_wait += t1 - t0
        self.transfer_time += env.now - t1
        install_prefix(dest, req)
        dest.ctx.submit(req)

    def summary(self) -> dict[str, float]:
        """Transfers, their bytes, mean link wait and mean transfer time."""
        n = self.num_transfers
        nan = float("nan")
        return {"num_kv_transfers": n, "kv_transfer_bytes": self.transfer_bytes,
                "kv_transfer_wait_mean": self.link_wait / n if n else nan,
                "kv_transfer_time_mean": self.transfer_time / n if n else nan}


def install_prefix(r: Replica, req: Request) -> int:
    """Put ``req``'s transferred prompt blocks in ``r``'s prefix cache (free, cached, last to
    be evicted); return the blocks installed. Stops when no block is free."""
    mgr = r.prefix_cache()
    if mgr is None:
        return 0
    mgr.update_hashes(req)
    pool = mgr.pool
    limit = (req.num_tokens - 1) // mgr.block_size
    done = 0
    for h in mgr.hashes.get(req.id, [])[:limit]:
        if pool.get_cached_block(h) is not None:
            continue
        blocks = pool.get_new_blocks(1)
        if blocks is None:
            break
        pool.cache_block(blocks[0], h)
        pool.free_blocks(blocks)
        done += 1
    return done
